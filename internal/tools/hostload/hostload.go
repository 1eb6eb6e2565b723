// Package hostload reads how busy this host is — its load averages — so a
// measurement that waits on CPU (make bench-path, hedgerow demo) can say
// what it ran beside.
package hostload

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// loadavgFile is where Linux keeps the load averages.
const loadavgFile = "/proc/loadavg"

// Averages is the 1, 5 and 15 minute load averages ("1.05 0.98 0.87"), or
// a note that they could not be read.
func Averages() string {
	b, err := os.ReadFile(loadavgFile)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return averages(string(b))
}

// averages keeps the 1, 5 and 15 minute load averages of a /proc/loadavg
// line.
func averages(s string) string {
	f := strings.Fields(s)
	return strings.Join(f[:min(3, len(f))], " ")
}

// OneMinute is the 1-minute load average: the runnable threads, averaged,
// to compare with the host's cores. It fails where the host keeps none
// (outside Linux).
func OneMinute() (float64, error) {
	b, err := os.ReadFile(loadavgFile)
	if err != nil {
		return 0, fmt.Errorf("load average: %w", err)
	}
	return oneMinute(string(b))
}

func oneMinute(s string) (float64, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, fmt.Errorf("load average: empty %s", loadavgFile)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("load average: %w", err)
	}
	return v, nil
}
