package dispatcher

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/hedgerow/hedgerow/schemas"
)

// TestAFinishedGroupIsNotKeptAliveByItsTimers checks that a group that has
// answered and ended can be garbage collected at once: the timers it armed
// (the deadline's runs for the whole deadline, 30 s by default) are stopped
// and cut off from it as its loop ends — a stopped timer may linger in the
// runtime's timer heap, so stopping alone leaves the group reachable at
// times. Left running, each held its group, so a gateway at 500
// requests a second kept 15,000 finished groups — about 150 MB — alive.
func TestAFinishedGroupIsNotKeptAliveByItsTimers(t *testing.T) {
	c := newCluster(t, []string{"a"}, nil, "")
	held := make(chan weak.Pointer[group], 1)
	startFakeWorker(t, c, []string{"a"}, func(fw *fakeWorker, a schemas.Attempt) {
		// While the attempt is in flight, its group is registered for replies.
		c.d.replies.mu.Lock()
		for _, g := range c.d.replies.groups {
			held <- weak.Make(g)
		}
		c.d.replies.mu.Unlock()
		fw.answer(a, "answer")
	})
	resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
	if err != nil || resp.Content != "answer" {
		t.Fatalf("Submit = %+v, %v; want the worker's answer", resp, err)
	}
	ptr := <-held
	// Close waits for every group's loop to end; the deadline timer (30 s)
	// and the hedge timer have not fired by then.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.d.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	runtime.GC()
	runtime.GC()
	if ptr.Value() != nil {
		t.Fatal("the finished group is still reachable after its loop ended: a timer it armed holds it")
	}
}
