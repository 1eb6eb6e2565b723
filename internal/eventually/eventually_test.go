package eventually

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeT records a Fatalf and ends its goroutine there, as testing.T does.
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	panic(f)
}

// run calls wait with a fakeT and returns what it failed with, or "".
func run(wait func(t testing.TB)) (failed string) {
	f := &fakeT{}
	defer func() {
		if r := recover(); r != nil && r != f {
			panic(r)
		}
		failed = f.failed
	}()
	wait(f)
	return ""
}

func TestTrueReturnsOnceTheConditionHolds(t *testing.T) {
	polls := 0
	failed := run(func(t testing.TB) {
		True(t, 10*time.Second, "the third poll", func() bool { polls++; return polls == 3 })
	})
	if failed != "" || polls != 3 {
		t.Fatalf("failed %q after %d polls, want no failure after 3", failed, polls)
	}
}

func TestTrueFailsAtTheTimeoutSayingWhatItWaitedFor(t *testing.T) {
	start := time.Now()
	failed := run(func(t testing.TB) {
		True(t, 20*time.Millisecond, "never", func() bool { return false })
	})
	if want := "timed out after 20ms waiting for never"; failed != want {
		t.Fatalf("failed %q, want %q", failed, want)
	}
	if took := time.Since(start); took < 20*time.Millisecond || took > 5*time.Second {
		t.Errorf("gave up after %v, want soon after 20ms", took)
	}
}

func TestClosedReturnsOnAClosedChannel(t *testing.T) {
	ch := make(chan struct{})
	close(ch)
	if failed := run(func(t testing.TB) { Closed(t, 10*time.Second, "closed", ch) }); failed != "" {
		t.Fatalf("failed %q on a closed channel", failed)
	}
}

func TestClosedFailsAtTheTimeoutSayingWhatItWaitedFor(t *testing.T) {
	failed := run(func(t testing.TB) { Closed(t, 10*time.Millisecond, "a close", make(chan struct{})) })
	if !strings.HasPrefix(failed, "timed out after 10ms waiting for a close") {
		t.Fatalf("failed %q, want a time-out naming what it waited for", failed)
	}
}
