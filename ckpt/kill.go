package ckpt

import "os"

// killSelf ends the process at once, without running deferred calls or flushing anything:
// os.Kill is SIGKILL on Unix and TerminateProcess on Windows.
func killSelf() {
	p, err := os.FindProcess(os.Getpid())
	if err == nil {
		err = p.Signal(os.Kill)
	}
	if err != nil {
		os.Exit(137)
	}
	select {} // the signal is on its way
}
