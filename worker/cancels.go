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

// pendingKey names a remembered cancel by its attempt and the secret it
// carried: only the cancel whose secret is the attempt's stands for it, and
// a forged one remembered first does not shadow it.
type pendingKey struct {
	attemptKey
	secret string
}

// pendingCancel is a cancel that arrived before its attempt.
type pendingCancel struct {
	reason schemas.CancelReason
	at     time.Time
}

// pendingCancels remembers early cancels for PendingCancelTTL, oldest
// first. It is not safe for concurrent use; the worker's mutex guards it.
type pendingCancels struct {
	byKey map[pendingKey]pendingCancel
	order []pendingEntry // insertion order, for expiry
}

type pendingEntry struct {
	key pendingKey
	at  time.Time
}

func newPendingCancels() *pendingCancels {
	return &pendingCancels{byKey: make(map[pendingKey]pendingCancel)}
}

// add remembers a cancel carrying secret received at now; a repeated cancel
// keeps the first.
func (p *pendingCancels) add(a attemptKey, secret string, reason schemas.CancelReason, now time.Time) {
	p.expire(now)
	k := pendingKey{a, secret}
	if _, ok := p.byKey[k]; ok {
		return
	}
	p.byKey[k] = pendingCancel{reason: reason, at: now}
	p.order = append(p.order, pendingEntry{key: k, at: now})
	for len(p.byKey) > maxPendingCancels {
		p.dropOldest()
	}
}

// take removes and returns the cancel remembered for attempt a with the
// attempt's secret, if it is still fresh. The map lookup compares secrets
// in time that depends on where they differ; it learns a forger nothing,
// who never sees whether its early cancel matched.
func (p *pendingCancels) take(a attemptKey, secret string, now time.Time) (pendingCancel, bool) {
	p.expire(now)
	k := pendingKey{a, secret}
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
