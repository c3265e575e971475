package train

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// OnSignal returns a context that the first SIGINT or SIGTERM cancels, which makes
// training stop after the step it is in (or the checkpoint being saved) and save a checkpoint
// there; a second signal ends the process at once (exit status 130), leaving the last complete
// checkpoint as `latest`. clock says what the run is doing; only a process that speaks (rank
// 0) prints.
func OnSignal(stderr io.Writer, clock *Clock, speak bool) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	quit := make(chan struct{})
	go func() {
		for n := 0; ; n++ {
			select {
			case <-sigs:
			case <-quit:
				return
			}
			if n > 0 {
				if speak {
					fmt.Fprintf(stderr, "\nstopped at once during step %d, without saving; the newest complete checkpoint stays `latest`\n", clock.step.Load())
				}
				os.Exit(130)
			}
			if speak {
				fmt.Fprintf(stderr, "\n%s\n", clock.StopMessage())
			}
			cancel()
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(quit)
		cancel()
	}
}
