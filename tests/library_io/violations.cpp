// What check_library_io.cmake must flag, and what it must let pass (this file is never compiled).
// getenv("A") and printf("x") and std::cerr in a comment pass.
const char* home = std::getenv("HOME");
/* a block comment: fprintf(stderr, "x");
   still the comment: std::cout << 1; */ int after_block = std::printf("y");
void f() { fmt::print(stderr, "z"); }
int fine = my_printf(1) + getenv_count;  // names that only contain the words pass
void g() { std::cerr << "w"; puts ("v"); }
