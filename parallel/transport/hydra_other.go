//go:build !linux

package transport

import "errors"

// unreadOutput is the number of bytes written to fd that its reader has not read yet; off
// Linux it does not say (0).
func unreadOutput(int) int { return 0 }

// writeFD would write b to the file descriptor fd: hydraAbort speaks to Hydra on Linux only.
func writeFD(int, []byte) error { return errors.New("not on Linux") }
