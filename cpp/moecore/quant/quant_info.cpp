// Anchor for the QuantInfo vtables.
#include "moecore/quant/quant_info.h"
