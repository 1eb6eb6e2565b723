//go:build !race

package simulator

// raceEnabled is set when the tests run under the race detector.
const raceEnabled = false
