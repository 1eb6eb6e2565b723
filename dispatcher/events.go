package dispatcher

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/dispatcher/hedge"
)

// groupInput is what reaches a group's loop: an engine event the driver
// posts (engineEvent), a wire message of one of its attempts
// (inboundEvent), or the driver's own retry of an attempt waiting for a
// route's capacity (capacityRetry, capacity.go). They arrive three ways —
// the start, which the caller's goroutine hands to handle directly; post,
// from the caller's goroutine, the timers and a failed publication;
// postMsg, from the reply router — and nothing else implements it.
type groupInput interface{ isGroupInput() }

// engineEvent is an engine event posted to the group's loop.
type engineEvent struct{ ev hedge.Event }

// inboundEvent wraps a wire message for the group's loop.
type inboundEvent struct {
	attempt int
	msg     *nats.Msg
	// arrived is when the reply mux took the message off NATS: a cancel it
	// causes is timed from there (hedgerow_cancel_dispatch_seconds).
	arrived time.Time
}

func (engineEvent) isGroupInput()  {}
func (inboundEvent) isGroupInput() {}

// post hands an engine event to the group's loop, unless the group is over.
func (g *group) post(ev hedge.Event) { g.events.post(engineEvent{ev}) }

// eventQueue holds a group's events, engine events and wire messages alike,
// in arrival order, for the group's loop. Posting never blocks, so the one
// goroutine routing every group's replies is never held up by a group whose
// caller reads slowly. Wire messages are bounded as a NATS subscription
// bounds its pending messages; past that they are dropped (the group sees a
// gap in the attempt's sequence).
type eventQueue struct {
	ready chan struct{} // signalled when evs becomes non-empty

	mu             sync.Mutex
	evs            []groupInput
	spare          []groupInput // the batch the loop last took, for reuse
	msgs, msgBytes int          // wire messages in evs
	closed         bool
}

func (q *eventQueue) post(ev groupInput) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.appendLocked(ev)
}

// postMsg queues a wire message of size bytes; false if the queue is full.
func (q *eventQueue) postMsg(ev inboundEvent, size int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return true
	}
	if q.msgs >= nats.DefaultSubPendingMsgsLimit || q.msgBytes+size > nats.DefaultSubPendingBytesLimit {
		return false
	}
	q.msgs++
	q.msgBytes += size
	q.appendLocked(ev)
	return true
}

func (q *eventQueue) appendLocked(ev groupInput) {
	if q.closed {
		return
	}
	q.evs = append(q.evs, ev)
	if len(q.evs) == 1 {
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
}

// take waits for events and returns them all, oldest first. The batch is
// the caller's until its next take.
func (q *eventQueue) take() []groupInput {
	for {
		q.mu.Lock()
		if len(q.evs) > 0 {
			batch := q.evs
			clear(q.spare)
			q.evs, q.spare = q.spare[:0], batch
			q.msgs, q.msgBytes = 0, 0
			q.mu.Unlock()
			return batch
		}
		q.mu.Unlock()
		<-q.ready
	}
}

// close drops what is queued and every later event.
func (q *eventQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	clear(q.evs)
	clear(q.spare)
	q.evs, q.spare = nil, nil
}
