package transporttest

import (
	"fmt"

	"distflash/parallel/transport"
)

// CheckTraffic compares a rank's byte counts with the expected ones, site by site (a site
// that sent nothing may be absent); sites not in want must not have been used. A World.Run
// names the rank in the error.
func CheckTraffic(got, want transport.Traffic) error {
	for site, b := range want {
		if g := got[site]; g != b {
			return fmt.Errorf("site %q sent %d bytes, want %d (all: %v)", site, g, b, got)
		}
	}
	for site := range got {
		if _, ok := want[site]; !ok {
			return fmt.Errorf("unexpected site %q (all: %v)", site, got)
		}
	}
	return nil
}

// TrafficSince is the bytes sent since before, by call site.
func TrafficSince(c transport.Comm, before transport.Traffic) transport.Traffic {
	return c.Traffic().Since(before)
}

// SameTraffic compares two byte counts site by site, a missing site counting as 0 bytes.
func SameTraffic(got, want transport.Traffic) error {
	keys := map[string]bool{}
	for k := range got {
		keys[k] = true
	}
	for k := range want {
		keys[k] = true
	}
	for k := range keys {
		if got[k] != want[k] {
			return fmt.Errorf("site %q: %d bytes, want %d (got %v, want %v)", k, got[k], want[k], got, want)
		}
	}
	return nil
}
