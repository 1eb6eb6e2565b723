package dispatcher

import (
	"sync/atomic"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/hedge"
)

// armedTimer is one timer the engine armed. It reaches its group through a
// pointer the group clears as it ends, since a stopped timer may linger in
// the runtime's timer heap and must not keep a finished group in memory.
type armedTimer struct {
	group atomic.Pointer[group]
	in    groupInput
	timer *time.Timer
}

// armTimer arms the timer the engine asked for; it posts its event to the
// group when it fires.
func (g *group) armTimer(a hedge.ArmTimer) {
	g.armInput(a.At, engineEvent{hedge.TimerFired{Kind: a.Kind, Attempt: a.Attempt}})
}

// armInput arms a timer that posts in to the group at at: an engine
// timer's event, or the driver's own (capacityRetry).
func (g *group) armInput(at time.Time, in groupInput) {
	t := &armedTimer{in: in}
	t.group.Store(g)
	t.timer = time.AfterFunc(max(at.Sub(g.d.now()), 0), t.fire)
	g.timers = append(g.timers, t)
}

func (t *armedTimer) fire() {
	if g := t.group.Load(); g != nil {
		g.events.post(t.in)
	}
}

// stopTimers stops every timer the group armed and cuts it off from the
// group, so a finished group is not kept in memory until its deadline.
func (g *group) stopTimers() {
	for _, t := range g.timers {
		t.timer.Stop()
		t.group.Store(nil)
	}
	g.timers = nil
}
