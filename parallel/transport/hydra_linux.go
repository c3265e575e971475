package transport

import "golang.org/x/sys/unix"

// unreadOutput is the number of bytes written to fd (a pipe to the launcher) that the
// launcher has not read yet; 0 when fd is not a pipe or cannot say.
func unreadOutput(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD
	if err != nil {
		return 0
	}
	return n
}

// writeFD writes b to the file descriptor fd, which stays open.
func writeFD(fd int, b []byte) error {
	_, err := unix.Write(fd, b)
	return err
}
