package world

import "errors"

// alike is an error every rank of a world meets alike.
type alike struct{ error }

func (e *alike) Unwrap() error { return e.error }

// Alike marks err (nil stays nil) as one that every rank of a launched world meets alike,
// because it follows from what every rank reads the same (the config, the model's config,
// the flags) or computes the same (the memory check): main prints it from rank 0 alone, where
// an error of one rank's own is printed by that rank. Mark only such errors: a rank whose
// alike error rank 0 does not meet would end the job without a word.
func Alike(err error) error {
	if err == nil {
		return nil
	}
	return &alike{err}
}

// IsAlike reports whether err, or an error it wraps, was marked by Alike.
func IsAlike(err error) bool {
	var a *alike
	return errors.As(err, &a)
}
