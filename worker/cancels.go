package worker

import (
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// PendingCancelTTL is how long a Cancel for an attempt the worker has not
// seen is remembered. The dispatcher sends a cancel only after the Accept
// that named this worker's control inbox, so a cancel can run ahead of its
// attempt only by the time two messages on different subscriptions take to
// be handled; seconds are ample, and a cancel for an attempt that already
// ended (the common case: a loser finishing as it is cancelled) is not
// kept for long.
const PendingCancelTTL = 10 * time.Second

// maxPendingCancels bounds the remembered cancels, so a flood of cancels
// for attempts that never come cannot grow the worker without limit.
const maxPendingCancels = 4096

// attemptKey names one attempt: a group's attempt numbers are unique.
type attemptKey struct {
	group   string
	attempt int
}

// pendingCancel is a cancel that arrived before its attempt.
type pendingCancel struct {
	reason schemas.CancelReason
	at     time.Time
}

// pendingCancels remembers early cancels for PendingCancelTTL, oldest
// first. It is not safe for concurrent use; the worker's mutex guards it.
type pendingCancels struct {
	byKey map[attemptKey]pendingCancel
	order []pendingEntry // insertion order, for expiry
}

type pendingEntry struct {
	key attemptKey
	at  time.Time
}

func newPendingCancels() *pendingCancels {
	return &pendingCancels{byKey: make(map[attemptKey]pendingCancel)}
}

// add remembers a cancel received at now; a repeated cancel keeps the first.
func (p *pendingCancels) add(k attemptKey, reason schemas.CancelReason, now time.Time) {
	p.expire(now)
	if _, ok := p.byKey[k]; ok {
		return
	}
	p.byKey[k] = pendingCancel{reason: reason, at: now}
	p.order = append(p.order, pendingEntry{key: k, at: now})
	for len(p.byKey) > maxPendingCancels {
		p.dropOldest()
	}
}

// take removes and returns the cancel remembered for k, if it is still fresh.
func (p *pendingCancels) take(k attemptKey, now time.Time) (pendingCancel, bool) {
	p.expire(now)
	c, ok := p.byKey[k]
	if ok {
		delete(p.byKey, k)
	}
	return c, ok
}

func (p *pendingCancels) len() int { return len(p.byKey) }

// expire forgets cancels older than PendingCancelTTL.
func (p *pendingCancels) expire(now time.Time) {
	for len(p.order) > 0 && now.Sub(p.order[0].at) >= PendingCancelTTL {
		p.dropOldest()
	}
	if len(p.order) == 0 {
		p.order = nil // let a long queue's backing array go
	}
}

func (p *pendingCancels) dropOldest() {
	e := p.order[0]
	p.order = p.order[1:]
	// The key may have been taken, or taken and added again later.
	if c, ok := p.byKey[e.key]; ok && c.at.Equal(e.at) {
		delete(p.byKey, e.key)
	}
}
