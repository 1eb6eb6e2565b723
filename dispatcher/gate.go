package dispatcher

import (
	"context"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/schemas"
)

// claim asks the winner gate for attempt. A group that supersedes an
// orphaned request (Submission.Supersedes) and meets that request's own
// group as the holder clears it, compare-and-delete, and claims once more:
// the orphan's gateway died with no answer kept, so its commit reached
// nobody (docs/architecture.md §2). Any other holder stands — another
// request's commit, even of the same dispatcher, may have been answered.
func (g *group) claim(ctx context.Context, attempt int) (arbiter.Claim, error) {
	claim, err := g.d.gate.Claim(ctx, g.ua, g.id, attempt)
	if err != nil || claim.Won || g.sub.Supersedes == "" {
		return claim, err
	}
	holder, perr := arbiter.ParseGateValue(claim.Holder)
	if perr != nil || holder.Group != g.sub.Supersedes {
		return claim, err
	}
	orphan := arbiter.Claim{UserAction: g.ua, Group: holder.Group, Attempt: holder.Attempt, Won: true, Value: claim.Holder}
	if cerr := g.d.gate.Clear(ctx, orphan); cerr != nil {
		g.d.log.Warn("orphaned commit not superseded", "group", g.id, "err", cerr)
		return claim, err
	}
	g.d.metrics.superseded.Inc()
	g.d.log.Info("orphaned commit superseded", "group", g.id, "orphan", holder.Group)
	g.supersedes = holder.Group
	g.keepSuperseded(holder)
	return g.d.gate.Claim(ctx, g.ua, g.id, attempt)
}

// keepSuperseded keeps the record that orphan's commit was superseded by
// this group (schemas.SupersededRecord, on a subject of its own so the
// orphan's record and usage stay), waiting for the store (bounded by the
// Recorder) before the group claims again: a commit of this group is never
// kept beside the orphan's with nothing marking the orphan's superseded
// (docs/architecture.md §9). A record not kept is logged; the group's own
// record still names the orphan (supersedes).
func (g *group) keepSuperseded(orphan arbiter.GateValue) {
	if g.d.records == nil {
		return
	}
	rec := schemas.SupersededRecord{EventTime: g.d.now(), Reporter: schemas.ReporterDispatcher, UserActionID: g.ua,
		HedgeGroupID: orphan.Group, WinnerAttempt: orphan.Attempt, GateEpoch: orphan.Epoch, SupersededBy: g.id}
	data, err := rec.MarshalJSON()
	if err == nil {
		err = g.d.records.Commit(schemas.StoredSupersededSubject(orphan.Group), data)
	}
	if err != nil {
		// The Recorder counts and logs its failures, at a bounded rate.
		g.d.log.Debug("superseded commit's record not kept", "group", g.id, "orphan", orphan.Group, "err", err)
	}
}
