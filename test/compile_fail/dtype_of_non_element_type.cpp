// `char` is not one of kiln's element types, so it has no dtype; the constraint
// failure must say which requirement broke.
// expect: invalid variable template 'dtype_of<char>'
// expect: has_dtype<T> \[with T = char\]' evaluated to 'false'
#include <kiln/kiln.hpp>

kiln::dtype d = kiln::dtype_of<char>;
