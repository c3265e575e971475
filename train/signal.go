package train

// OnSignal says what stop requests (Ctrl-C, SIGTERM) mean to training, for the command's
// signal helper: the first stops training after the step it is in (or the checkpoint being
// saved) with a checkpoint there, which stop says (Clock.StopMessage); a second ends the
// process at once, leaving the last complete checkpoint as `latest`, which now says.
func OnSignal(c *Clock) (stop, now func() string) { return c.StopMessage, c.NowMessage }
