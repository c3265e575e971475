package data

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// ExpandPath expands a configured path: a leading ~/ (or a lone ~) becomes the user's home
// directory, $GOROOT and ${GOROOT} the Go installation's root, and any other $VAR or ${VAR}
// the value of that environment variable.
//
// GOROOT comes from the GOROOT environment variable, else from `go env GOROOT`, else from
// the root recorded in this binary (runtime.GOROOT), so "$GOROOT/src" names the Go sources
// on any machine that can build distflash. Any other variable that is not set is an error,
// not an empty string, so that a typo does not turn "$DATA/train" into "/train".
func ExpandPath(p string) (string, error) {
	orig := p
	if p == "~" || strings.HasPrefix(p, "~/") || strings.HasPrefix(p, "~"+string(filepath.Separator)) {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("data: expand %q: %w", orig, err)
		}
		p = home + p[1:]
	}
	var errs []string
	p = os.Expand(p, func(name string) string {
		if name == "GOROOT" {
			g, err := goroot()
			if err != nil {
				errs = append(errs, err.Error())
			}
			return g
		}
		v, ok := os.LookupEnv(name)
		if !ok {
			errs = append(errs, fmt.Sprintf("$%s is not set", name))
		}
		return v
	})
	if len(errs) > 0 {
		return "", fmt.Errorf("data: expand %q: %s", orig, strings.Join(errs, "; "))
	}
	return p, nil
}

// goEnvGOROOT runs `go env GOROOT` once per process.
var goEnvGOROOT = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
			return "", fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
})

// goroot finds the Go installation's root directory; see ExpandPath.
func goroot() (string, error) {
	if g := os.Getenv("GOROOT"); g != "" {
		return g, nil
	}
	g, err := goEnvGOROOT()
	if err == nil && g != "" {
		return g, nil
	}
	if err == nil {
		err = fmt.Errorf("it printed nothing")
	}
	// runtime.GOROOT is deprecated (Go 1.24) because a binary may run far from the
	// toolchain that built it; it is only the last resort here, after $GOROOT and go env.
	//lint:ignore SA1019 the last resort, after the two ways staticcheck recommends
	if g := runtime.GOROOT(); g != "" {
		return g, nil
	}
	return "", fmt.Errorf("$GOROOT: the GOROOT environment variable is not set, `go env GOROOT` failed (%v), and this binary records no GOROOT", err)
}

// ShowPath writes p for a message: expanded (ExpandPath), followed by p as written when the
// two differ, "/usr/local/go/test ($GOROOT/test)"; p itself when it does not expand.
func ShowPath(p string) string {
	e, err := ExpandPath(p)
	if err != nil || e == p {
		return p
	}
	return e + " (" + p + ")"
}
