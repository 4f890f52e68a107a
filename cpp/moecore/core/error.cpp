// Out-of-line anchors for the exception types (keeps their vtables in one object file).
#include "moecore/core/error.h"
