package redistest

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// Moving Redis's clock: the calendar windows' tests need Redis to live on a DST day or at a
// month's end. Debian's libfaketime cannot do it for Debian's redis-server 7.0: linked with
// jemalloc, it calls clock_gettime while libfaketime initializes, and libfaketime gives up
// ("Cannot recover from unexpected recursive calls to clock_gettime()"), so the server never
// starts. clockshift.c.in is the part of libfaketime these tests need: gettimeofday,
// clock_gettime(CLOCK_REALTIME) and time, shifted by CLOCK_SHIFT_SECONDS, read through the raw
// system call so that nothing recurses. It is built once per test binary with the system's C
// compiler (cc) and preloaded (LD_PRELOAD) into the shifted servers only; the real-time and
// monotonic clocks of everything else are untouched.

//go:embed clockshift.c.in
var clockShiftSource []byte

var clockShiftLib = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "redistest-clockshift-")
	if err != nil {
		return "", err
	}
	src, lib := filepath.Join(dir, "clockshift.c"), filepath.Join(dir, "clockshift.so")
	if err := os.WriteFile(src, clockShiftSource, 0o644); err != nil {
		return "", err
	}
	out, err := exec.Command("cc", "-shared", "-fPIC", "-O2", "-o", lib, src).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building the clock shift library with cc (Debian's gcc): %w\n%s", err, out)
	}
	return lib, nil
})

// StartAt starts a server whose clock reads at when it starts, and runs on from there.
func StartAt(at time.Time, extra ...string) (*Server, error) {
	lib, err := clockShiftLib()
	if err != nil {
		return nil, err
	}
	return startEnv([]string{"LD_PRELOAD=" + lib, shiftVar(at)}, extra)
}

// MoveClock makes the server's clock read at when it next starts (see Stop and Start): a
// server started with StartAt only.
func (s *Server) MoveClock(at time.Time) error {
	for i, e := range s.env {
		if len(e) > len(shiftPrefix) && e[:len(shiftPrefix)] == shiftPrefix {
			s.env[i] = shiftVar(at)
			return nil
		}
	}
	return fmt.Errorf("redis-server on %s was not started with StartAt", s.Addr())
}

const shiftPrefix = "CLOCK_SHIFT_SECONDS="

func shiftVar(at time.Time) string {
	return shiftPrefix + strconv.FormatInt(int64(time.Until(at).Seconds()), 10)
}
