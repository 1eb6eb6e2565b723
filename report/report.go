package report

import (
	"cmp"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/hedgerow/hedgerow/schemas"
)

// Defaults of Options.
const (
	// DefaultResamples is how many bootstrap resamples the gain's interval
	// is taken over.
	DefaultResamples = 1000
	// DefaultSeed seeds the bootstrap, so one set of records always gives
	// one interval.
	DefaultSeed = 1
	// DefaultMinSamples is the floor of groups in each arm below which the
	// gain and its interval are withheld: a P99 of fewer than 100 groups is
	// their maximum, and its ratio says nothing (the guardrail's own floors,
	// 1000 control and 500 hedged, docs/architecture.md §5, are stricter
	// because it acts on the figure).
	DefaultMinSamples = 100
	// EvaluationControlShare is the control share a withheld gain's
	// SampleNeed also counts for: what an evaluation period may raise
	// policies.<class>.control_fraction to (default 0.01), to reach the
	// floor ten times sooner (docs/architecture.md §5, "Control fraction").
	EvaluationControlShare = 0.10
)

// Options tune Compute; the zero value means the defaults.
type Options struct {
	Seed       uint64
	Resamples  int
	MinSamples int
}

func (o Options) withDefaults() Options {
	if o.Seed == 0 {
		o.Seed = DefaultSeed
	}
	if o.Resamples <= 0 {
		o.Resamples = DefaultResamples
	}
	if o.MinSamples <= 0 {
		o.MinSamples = DefaultMinSamples
	}
	return o
}

// Report is the whole report: the figures over every group, and per cohort.
type Report struct {
	// Records is how many records the report was computed from; Orphans
	// counts attempt records whose group record is missing (a dispatcher
	// that stopped before publishing it), which no figure includes.
	Records        int `json:"records"`
	OrphanAttempts int `json:"orphan_attempts"`
	// UserActions counts the user actions of the groups; CommittedTwice
	// those with more than one committed group that no takeover
	// superseded — a user action committed twice (docs/architecture.md §6).
	UserActions    int       `json:"user_actions"`
	CommittedTwice int       `json:"user_actions_committed_twice"`
	Total          Section   `json:"total"`
	Cohorts        []Section `json:"cohorts"`
	// Regions breaks the figures down by the region whose gateway ran each
	// group (its record's region, docs/architecture.md §14), keyed by
	// region; groups recorded without one are under NoRegion. Present only
	// when the records hold more than one region: the report of a
	// deployment of one region is as it was before regions. Total and
	// Cohorts are over every region.
	Regions map[string]RegionReport `json:"regions,omitempty"`
}

// NoRegion keys, in Report.Regions, the groups whose record names no
// region (kept before the deployment named its regions). A region's name
// is a token of [a-z0-9_-], so it never reads as this.
const NoRegion = "(none)"

// RegionReport is the figures of one region's groups: over all of them,
// and per cohort.
type RegionReport struct {
	Total   Section   `json:"total"`
	Cohorts []Section `json:"cohorts"`
}

// Section is the figures of one cohort, or of all groups (Cohort empty).
type Section struct {
	// Cohort is operation class / model class / stream or complete, as
	// records name a cohort (they carry no max_tokens bucket).
	Cohort string `json:"cohort,omitempty"`
	// Groups counts group records; ControlGroups those the control draw
	// put in the guardrail's control arm; FailedGroups those that ended
	// without an answer.
	Groups        int `json:"groups"`
	ControlGroups int `json:"control_groups"`
	FailedGroups  int `json:"failed_groups"`
	// CommittedGroups counts the committed groups no takeover superseded;
	// SupersededGroups the committed groups a takeover did (a superseded
	// record, or a group record's supersedes, names them): their gateway
	// died with their commit, the takeover's group answered the user
	// action instead (docs/architecture.md §2). Groups is the sum of the
	// three.
	CommittedGroups  int `json:"committed_groups"`
	SupersededGroups int `json:"superseded_groups"`
	// Hedged is every group outside the control fraction, as the
	// guardrail's arms are (docs/architecture.md §5); Control the rest, at
	// the latency each would have had primary-only (its
	// control_baseline_ms): a control group hedges, and runs its baseline
	// on past another attempt's commit to measure it. A control group
	// whose baseline is unknown has no sample.
	Hedged  Arm `json:"hedged"`
	Control Arm `json:"control"`
	// Gain is control P99 ÷ hedged P99 with its bootstrap interval; nil,
	// and GainWithheld says why, while an arm is below the sample floor.
	Gain         *Gain  `json:"gain,omitempty"`
	GainWithheld string `json:"gain_withheld,omitempty"`
	// GainNeeds, with GainWithheld, is how many more groups the gain waits
	// for.
	GainNeeds *SampleNeed `json:"gain_needs,omitempty"`
	// Attempts counts attempt records; DuplicateRate is the attempts
	// beyond each group's first, per group.
	Attempts      int     `json:"attempts"`
	DuplicateRate float64 `json:"duplicate_rate"`
	Usage         Usage   `json:"usage"`
	// ExtraCostRatio is what attempts that did not win, and every attempt
	// of a superseded group, cost over what winners cost, at input + 4 ×
	// output (docs/architecture.md §11).
	ExtraCostRatio float64 `json:"extra_cost_ratio"`
	// LateCompletions counts losers that completed anyway (loser_late).
	LateCompletions int `json:"late_completions"`
	// CancellationsSent counts attempts a cancel was sent to;
	// CancellationObservedRatio the share of those whose worker observed it
	// before completing (0 with none sent).
	CancellationsSent         int     `json:"cancellations_sent"`
	CancellationObservedRatio float64 `json:"cancellation_observed_ratio"`
	// Suppressed counts groups by the reason their hedge was suppressed;
	// Guardrail counts groups by the guardrail's decision.
	Suppressed map[string]int `json:"suppressed"`
	Guardrail  map[string]int `json:"guardrail"`

	// latencies of the arms, sorted, for plots.
	hedgedMs, controlMs []float64
}

// Arm is one arm's latency quantiles in ms (nearest rank over the exact
// sorted latencies; 0 for an empty arm, never null) and its groups. A
// group's latency is the time to its first byte for a stream that has one,
// else to its commit; a failed group counts at its deadline, as the
// guardrail counts it.
type Arm struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	P999    float64 `json:"p999_ms"`
}

// Usage is usage units (input + output) of the attempts that won and of
// every other attempt, the attempts of superseded groups apart: paid, but
// none of them answered the user action.
type Usage struct {
	Winners    int64 `json:"winners"`
	Losers     int64 `json:"losers"`
	Superseded int64 `json:"superseded"`
}

// Gain is the tail gain at the P99: control ÷ hedged (above 1: hedging
// cut the tail), with the percentile bootstrap's 95% interval over
// Resamples resamples of both arms, seeded with Seed. Latencies under 1
// ms count as 1 ms in the ratio.
type Gain struct {
	Quantile       string  `json:"quantile"`
	Ratio          float64 `json:"ratio"`
	Lower          float64 `json:"lower"`
	Upper          float64 `json:"upper"`
	HedgedSamples  int     `json:"hedged_samples"`
	ControlSamples int     `json:"control_samples"`
	Resamples      int     `json:"resamples"`
	Seed           uint64  `json:"seed"`
}

// SampleNeed is what a withheld gain waits for: how many more groups each
// arm needs to reach the sample floor, and about how many more groups in
// all that takes at the control share the records show and at
// EvaluationControlShare. Control groups hedge as any group does, so a
// larger share costs the callers no latency; it costs tokens: a control
// group whose hedge wins keeps its primary running to its own commit point
// (docs/architecture.md §5, "Control fraction").
type SampleNeed struct {
	Floor       int `json:"floor"`
	HedgedMore  int `json:"hedged_more"`
	ControlMore int `json:"control_more"`
	// ControlShare is the section's control groups over its groups;
	// GroupsMore the groups it takes at that share (0 with no control
	// group yet: the share is unknown).
	ControlShare float64 `json:"control_share"`
	GroupsMore   int     `json:"groups_more"`
	// GroupsMoreAtEvaluation is the groups it takes at
	// EvaluationControlShare.
	EvaluationShare        float64 `json:"evaluation_control_share"`
	GroupsMoreAtEvaluation int     `json:"groups_more_at_evaluation_share"`
}

// sampleNeed is what arms of hedged and control samples lack of the floor,
// with control groups drawn at controlShare of the groups.
func sampleNeed(hedged, control, floor int, controlShare float64) *SampleNeed {
	n := &SampleNeed{Floor: floor, HedgedMore: max(0, floor-hedged), ControlMore: max(0, floor-control),
		ControlShare: controlShare, EvaluationShare: EvaluationControlShare}
	groupsAt := func(share float64) int {
		if share <= 0 || share >= 1 {
			return 0
		}
		return int(math.Ceil(max(float64(n.HedgedMore)/(1-share), float64(n.ControlMore)/share)))
	}
	n.GroupsMore = groupsAt(controlShare)
	n.GroupsMoreAtEvaluation = groupsAt(EvaluationControlShare)
	return n
}

// HedgedLatencies and ControlLatencies are the arms' latencies in ms,
// sorted (for plots).
func (s *Section) HedgedLatencies() []float64  { return s.hedgedMs }
func (s *Section) ControlLatencies() []float64 { return s.controlMs }

// CohortOf names a group's cohort as the report does.
func CohortOf(g *schemas.GroupRecord) string {
	mode := "complete"
	if g.Stream {
		mode = "stream"
	}
	return g.OperationClass + "/" + g.ModelClass + "/" + mode
}

// latencyMs is the latency a group counts with in the arms.
// controlLatencyMs is a control group's latency had it run primary-only,
// the control arm's sample (docs/architecture.md §5): its
// control_baseline_ms; a group without one that never hedged ran
// primary-only (every control group did before control groups hedged), so
// its own latency; one that hedged without it has no sample (its
// baseline failed on its own after the hedge launched).
func controlLatencyMs(g *schemas.GroupRecord) (float64, bool) {
	switch {
	case g.ControlBaselineMs != nil:
		return float64(*g.ControlBaselineMs), true
	case !g.HedgeLaunched:
		return latencyMs(g), true
	}
	return 0, false
}

func latencyMs(g *schemas.GroupRecord) float64 {
	switch {
	case g.Outcome != schemas.GroupCommitted:
		return float64(g.OverallDeadlineMs)
	case g.Stream && g.FirstByteMs != nil:
		return float64(*g.FirstByteMs)
	}
	return float64(g.ElapsedMs)
}

// Compute reports over recs. A group kept twice (its record at the commit
// and at its end, in a file of live records) counts once, by its final
// record; an attempt kept twice counts once, by its last record. A
// committed group that a superseded record or a takeover's group record
// names is counted superseded, not committed, so a user action whose
// gateway died with its commit counts the takeover's commit only. When the
// groups' records name more than one region, each region's figures are
// computed as well (Report.Regions), at the cost of a bootstrap per
// region's section besides the totals'.
func Compute(recs *Records, o Options) *Report {
	o = o.withDefaults()
	groups := map[string]*schemas.GroupRecord{}
	for i := range recs.Groups {
		g := &recs.Groups[i]
		if prev := groups[g.HedgeGroupID]; prev != nil && prev.Event == schemas.EventGroupComplete && g.Event != schemas.EventGroupComplete {
			continue
		}
		groups[g.HedgeGroupID] = g
	}
	type attemptKey struct {
		group string
		n     int
	}
	attempts := map[attemptKey]*schemas.AttemptRecord{}
	for i := range recs.Attempts {
		a := &recs.Attempts[i]
		attempts[attemptKey{a.HedgeGroupID, a.Attempt}] = a
	}
	superseded := map[string]bool{}
	for _, sr := range recs.Superseded {
		superseded[sr.HedgeGroupID] = true
	}
	for _, g := range recs.Groups {
		if g.Supersedes != "" {
			superseded[g.Supersedes] = true
		}
	}
	byGroup := map[string][]*schemas.AttemptRecord{}
	rep := &Report{Records: recs.Len()}
	for k, a := range attempts {
		if groups[k.group] == nil {
			rep.OrphanAttempts++
			continue
		}
		byGroup[k.group] = append(byGroup[k.group], a)
	}

	all := newSections()
	regions := map[string]*sections{}
	commits := map[string]int{} // user action → committed groups, superseded ones apart
	for _, id := range slices.Sorted(maps.Keys(groups)) {
		g := groups[id]
		region := cmp.Or(g.Region, NoRegion)
		r := regions[region]
		if r == nil {
			r = newSections()
			regions[region] = r
		}
		sup := g.Outcome == schemas.GroupCommitted && superseded[id]
		all.add(g, byGroup[id], sup)
		r.add(g, byGroup[id], sup)
		if g.UserActionID == "" {
			continue
		}
		if _, seen := commits[g.UserActionID]; !seen {
			commits[g.UserActionID] = 0
		}
		if g.Outcome == schemas.GroupCommitted && !sup {
			commits[g.UserActionID]++
		}
	}
	rep.UserActions = len(commits)
	for _, n := range commits {
		if n > 1 {
			rep.CommittedTwice++
		}
	}
	rep.Total, rep.Cohorts = all.sections(o)
	if len(regions) > 1 {
		rep.Regions = make(map[string]RegionReport, len(regions))
		for name, r := range regions {
			var rr RegionReport
			rr.Total, rr.Cohorts = r.sections(o)
			rep.Regions[name] = rr
		}
	}
	return rep
}

// sections accumulates the figures of a set of groups: over all of them
// and per cohort.
type sections struct {
	total   *acc
	cohorts map[string]*acc
}

func newSections() *sections { return &sections{total: newAcc(""), cohorts: map[string]*acc{}} }

// add counts group g, with its attempts, in the total and its cohort.
func (ss *sections) add(g *schemas.GroupRecord, atts []*schemas.AttemptRecord, superseded bool) {
	name := CohortOf(g)
	c := ss.cohorts[name]
	if c == nil {
		c = newAcc(name)
		ss.cohorts[name] = c
	}
	ss.total.add(g, atts, superseded)
	c.add(g, atts, superseded)
}

// sections computes the total's section and each cohort's, by name.
func (ss *sections) sections(o Options) (Section, []Section) {
	cohorts := make([]Section, 0, len(ss.cohorts))
	for _, name := range slices.Sorted(maps.Keys(ss.cohorts)) {
		cohorts = append(cohorts, ss.cohorts[name].section(o))
	}
	return ss.total.section(o), cohorts
}

// acc accumulates one section.
type acc struct {
	s                   Section
	winnerCost, losCost int64
	observed            int
	// withAttempts counts groups with at least one attempt record.
	withAttempts int
}

func newAcc(cohort string) *acc {
	return &acc{s: Section{Cohort: cohort, Suppressed: map[string]int{}, Guardrail: map[string]int{}}}
}

// add counts group g with its attempts; superseded says a takeover
// superseded its commit.
func (a *acc) add(g *schemas.GroupRecord, atts []*schemas.AttemptRecord, superseded bool) {
	s := &a.s
	s.Groups++
	switch {
	case g.Outcome != schemas.GroupCommitted:
		s.FailedGroups++
	case superseded:
		s.SupersededGroups++
	default:
		s.CommittedGroups++
	}
	if g.GuardrailDecision == schemas.GuardrailControl {
		s.ControlGroups++
		if lat, ok := controlLatencyMs(g); ok {
			s.controlMs = append(s.controlMs, lat)
		}
	} else {
		s.hedgedMs = append(s.hedgedMs, latencyMs(g))
	}
	if g.HedgeSuppressedReason != "" {
		s.Suppressed[g.HedgeSuppressedReason]++
	}
	if g.GuardrailDecision != "" {
		s.Guardrail[string(g.GuardrailDecision)]++
	}
	s.Attempts += len(atts)
	if len(atts) > 0 {
		a.withAttempts++
	}
	for _, at := range atts {
		units := at.UsageInputUnits + at.UsageOutputUnits
		cost := at.UsageInputUnits + 4*at.UsageOutputUnits
		switch {
		case superseded:
			s.Usage.Superseded += units
			a.losCost += cost
		case at.Outcome == schemas.OutcomeWinner:
			s.Usage.Winners += units
			a.winnerCost += cost
		default:
			s.Usage.Losers += units
			a.losCost += cost
		}
		if at.Outcome == schemas.OutcomeLoserLate {
			s.LateCompletions++
		}
		if at.CancellationSent {
			s.CancellationsSent++
			if at.CancellationObserved {
				a.observed++
			}
		}
	}
}

func (a *acc) section(o Options) Section {
	s := a.s
	slices.Sort(s.hedgedMs)
	slices.Sort(s.controlMs)
	s.Hedged = arm(s.hedgedMs)
	s.Control = arm(s.controlMs)
	if s.Groups > 0 {
		// Attempts beyond the first of each group: every attempt record
		// but one per group that has any.
		extra := s.Attempts - a.withAttempts
		s.DuplicateRate = float64(extra) / float64(s.Groups)
	}
	if a.winnerCost > 0 {
		s.ExtraCostRatio = float64(a.losCost) / float64(a.winnerCost)
	}
	if s.CancellationsSent > 0 {
		s.CancellationObservedRatio = float64(a.observed) / float64(s.CancellationsSent)
	}
	s.Gain, s.GainWithheld = gain(s.hedgedMs, s.controlMs, o)
	if s.Gain == nil {
		share := 0.0
		if s.Groups > 0 {
			share = float64(s.ControlGroups) / float64(s.Groups)
		}
		s.GainNeeds = sampleNeed(len(s.hedgedMs), len(s.controlMs), o.MinSamples, share)
	}
	return s
}

// arm is the quantiles of sorted latencies.
func arm(sorted []float64) Arm {
	return Arm{Samples: len(sorted), P50: quantile(sorted, 0.50), P99: quantile(sorted, 0.99), P999: quantile(sorted, 0.999)}
}

// quantile is the nearest-rank q-quantile of sorted: the smallest value
// with at least q of the values at or below it; 0 for none.
func quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	return sorted[rank(n, q)]
}

// rank is the 0-based index of the nearest-rank q-quantile of n values.
func rank(n int, q float64) int {
	r := int(math.Ceil(q*float64(n))) - 1
	return min(max(r, 0), n-1)
}

// TailGain is the gain of Compute for two arms of latencies given apart
// (sorted, ms): control P99 ÷ hedged P99 with its seeded bootstrap
// interval, or nil and why it is withheld below o.MinSamples per arm.
// `hedgerow demo` takes it of its primary-only run against its hedged one.
func TailGain(hedged, control []float64, o Options) (*Gain, string) {
	return gain(hedged, control, o.withDefaults())
}

// gain bootstraps control P99 ÷ hedged P99, or says why it is withheld.
func gain(hedged, control []float64, o Options) (*Gain, string) {
	if len(hedged) < o.MinSamples || len(control) < o.MinSamples {
		return nil, "below the sample floor of " + strconv.Itoa(o.MinSamples) + " groups per arm (hedged " +
			strconv.Itoa(len(hedged)) + ", control " + strconv.Itoa(len(control)) + ")"
	}
	ratio := func(c, h float64) float64 { return math.Max(c, 1) / math.Max(h, 1) }
	g := &Gain{Quantile: "p99", Ratio: ratio(quantile(control, 0.99), quantile(hedged, 0.99)),
		HedgedSamples: len(hedged), ControlSamples: len(control), Resamples: o.Resamples, Seed: o.Seed}
	rng := rand.New(rand.NewPCG(o.Seed, 0x68656467)) // "hedg"
	hc, cc := make([]int32, len(hedged)), make([]int32, len(control))
	ratios := make([]float64, o.Resamples)
	for i := range ratios {
		ratios[i] = ratio(resampledQuantile(rng, control, cc, 0.99), resampledQuantile(rng, hedged, hc, 0.99))
	}
	slices.SortFunc(ratios, cmp.Compare[float64])
	g.Lower, g.Upper = quantile(ratios, 0.025), quantile(ratios, 0.975)
	return g, ""
}

// resampledQuantile draws len(sorted) values of sorted with replacement
// and returns their nearest-rank q-quantile, counting draws per index
// (counts is scratch of len(sorted)) instead of sorting the draw.
func resampledQuantile(rng *rand.Rand, sorted []float64, counts []int32, q float64) float64 {
	n := len(sorted)
	clear(counts)
	for range n {
		counts[rng.IntN(n)]++
	}
	want := rank(n, q) + 1 // draws at or below the quantile
	seen := 0
	for i, c := range counts {
		seen += int(c)
		if seen >= want {
			return sorted[i]
		}
	}
	return sorted[n-1]
}
