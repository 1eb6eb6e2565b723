package dispatcher

import (
	"strconv"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/hedge"
	"github.com/hedgerow/hedgerow/dispatcher/policy"
	"github.com/hedgerow/hedgerow/schemas"
)

func (g *group) attemptEnded(e hedge.AttemptEnded) {
	d := g.d
	a := g.attempt(e.Attempt)
	_ = d.picker.Release(a.route)
	g.endCharge(a, e.Status)
	d.observeRoute(g.sub.Pool, e)
	if e.Attempt == 1 {
		g.judgeStall(false, true)
	}
	a.outcome = e.Outcome
	if e.Role == schemas.RoleContinuation {
		// Part of an answer: no sample of the cohort's answers.
		g.countRescue(a, rescueFailed) // unless it was spliced in or beaten first
	} else {
		g.class.ObserveAnswer(g.cohort.Key(), e.Status, e.Usage, e.Elapsed, e.FirstByte)
	}
	if e.Outcome == hedge.OutcomeLoserLate {
		d.metrics.late.Inc()
	}
	if e.CancellationSent {
		d.metrics.cancellations.WithLabelValues(strconv.FormatBool(e.CancellationObserved)).Inc()
	}
	g.ended = g.ended.Add(e.Usage)
	d.metrics.usage.WithLabelValues(string(e.Role), "input").Add(float64(e.Usage.InputUnits))
	d.metrics.usage.WithLabelValues(string(e.Role), "output").Add(float64(e.Usage.OutputUnits))
	rec := g.attemptRecord(a, e)
	if d.tracer != nil {
		a.ended = &AttemptTimeline{Launched: a.launchedAt, Ended: d.now(), Record: rec}
	}
	g.publish(pendingRecord{subject: d.wire.AttemptRecordSubject(), rec: rec,
		stored: schemas.StoredAttemptSubject(g.id, a.n)})
}

// observeSuperseded offers the primary's elapsed time to the class's
// censoring rule as the group ends, and reports whether it was recorded.
func (g *group) observeSuperseded(now time.Time, e hedge.GroupEnded) bool {
	p := g.attempt(1)
	if p == nil {
		return false
	}
	return g.class.ObserveSuperseded(g.cohort, now,
		policy.Primary{Route: p.route, Elapsed: now.Sub(p.launchedAt), FirstByte: p.firstByte > 0, Failed: p.outcome == hedge.OutcomeFailed},
		policy.Decision{Winner: e.Winner, Error: e.Error})
}

// observeGuardrail adds the ended group's sample to its guardrail arm, by
// the class's rule (policy.Class.ObserveGroup: a control group's is its
// baseline's), and reports whether it did.
func (g *group) observeGuardrail(now time.Time, e hedge.GroupEnded) bool {
	return g.class.ObserveGroup(g.cohort, now, g.arm, e, g.deadline, func(n int) time.Duration {
		if a := g.attempt(n); a != nil && a.firstByte > 0 {
			return a.launchedAt.Sub(g.start) + a.firstByte
		}
		return 0
	})
}

// releaseHeld hands over the answer held for the attempts' total usage
// (Submission.AwaitTotalUsage), with usage as that total.
func (g *group) releaseHeld(usage schemas.Usage) {
	if g.held == nil {
		return
	}
	g.held.TotalUsage = usage
	g.send(delivery{resp: g.held})
	g.held = nil
}

func (g *group) groupEnded(e hedge.GroupEnded) {
	d := g.d
	now := d.now()
	g.observeSuperseded(now, e)
	g.observeGuardrail(now, e)
	g.checkSpendBreach(e)
	g.releaseHeld(e.Usage)
	if g.armed {
		d.metrics.hedgeDelay.Observe(g.delay.Seconds())
	}
	rec := g.groupRecord(e)
	g.trace(now, rec)
	if g.committed != nil {
		// The group ended in the event that committed it: its full record
		// is kept before the answer instead.
		rec.Event = schemas.EventGroupComplete
		g.committed = &rec
		data := g.keepCommit()
		g.publish(pendingRecord{subject: g.d.wire.GroupRecordSubject(), rec: rec, data: data})
		return
	}
	g.publish(pendingRecord{subject: g.d.wire.GroupRecordSubject(), rec: rec,
		stored: schemas.StoredGroupSubject(g.id)})
}

// trace hands the ended group's timeline to the Tracer, if there is one.
func (g *group) trace(now time.Time, rec schemas.GroupRecord) {
	if g.d.tracer == nil {
		return
	}
	tl := GroupTimeline{Start: g.start, End: now, TraceParent: g.sub.TraceParent, Embeddings: g.sub.Request.Embedding != nil, Group: rec}
	for _, a := range g.attempts {
		if a.ended != nil {
			tl.Attempts = append(tl.Attempts, *a.ended)
		}
	}
	g.d.tracer.GroupEnded(tl)
}
