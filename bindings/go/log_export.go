package kvmem

// The log callback C calls; its trampoline is in kvmem.go (a file with
// //export may hold C declarations only).

/*
#include <stdlib.h>
*/
import "C"

//export kvgoLog
func kvgoLog(level C.int, message *C.char) {
	logDispatch(int(level), C.GoString(message))
}
