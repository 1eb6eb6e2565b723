// Package eventually waits, in tests, for what will happen soon but gives
// no event to wait on (routes formed, a client reconnected, a lease given
// back), or for a channel to be closed. Every wait is bounded: reaching the
// bound fails the test with what it waited for.
package eventually

import (
	"testing"
	"time"
)

// Backoff between polls: short at first, so a condition that holds soon is
// seen soon, then longer, so a slow one is not polled in a busy loop.
const (
	firstBackoff = time.Millisecond
	maxBackoff   = 50 * time.Millisecond
)

// True polls cond with a short backoff until it returns true, and fails the
// test with "timed out after <timeout> waiting for <what>" if it has not
// within timeout. cond runs on the test's goroutine, so it may fail the test
// itself.
func True(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	backoff := firstBackoff
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(backoff) // polling: the condition has no event to wait on
		backoff = min(2*backoff, maxBackoff)
	}
}

// Closed waits until ch is closed (or receives), and fails the test with
// "timed out after <timeout> waiting for <what>" if it has not within
// timeout. The bound only turns a hang into a failure.
func Closed(t testing.TB, timeout time.Duration, what string, ch <-chan struct{}) {
	t.Helper()
	bound := time.NewTimer(timeout)
	defer bound.Stop()
	select {
	case <-ch:
	case <-bound.C:
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}
