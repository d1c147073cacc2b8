/* The mgtrain executable: hands argv to the app module. */
#include "app/app.h"

int main(int argc, char **argv) { return mgt_app_main(argc, argv); }
