package report

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the report as a table: one row per cohort and one for
// all groups, then the user actions committed twice, and each section's
// gain (or why it is withheld), superseded commits, suppressions and
// guardrail decisions. When the report breaks down by region, a region
// column leads and each region's cohorts and total come first, then every
// region's ("all"); a section's name in the notes below the table is then
// prefixed by its region, the all-regions ones unprefixed.
func (r *Report) WriteTable(w io.Writer) error {
	type row struct {
		region string // "" without a breakdown by region
		s      Section
	}
	var rows []row
	for _, name := range slices.Sorted(maps.Keys(r.Regions)) {
		rr := r.Regions[name]
		for _, s := range append(slices.Clone(rr.Cohorts), rr.Total) {
			rows = append(rows, row{name, s})
		}
	}
	all := ""
	if len(r.Regions) > 0 {
		all = "all"
	}
	for _, s := range append(slices.Clone(r.Cohorts), r.Total) {
		rows = append(rows, row{all, s})
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "cohort\tgroups\tcommitted\tsuperseded\tcontrol\thedged p50\tp99\tp99.9\tcontrol p50\tp99\tp99.9\tdup rate\tusage win\tusage lose\textra cost\tlate\tcancel obs\t"
	if all != "" {
		head = "region\t" + head
	}
	fmt.Fprintln(tw, head)
	for _, rw := range rows {
		s := rw.s
		if all != "" {
			fmt.Fprintf(tw, "%s\t", rw.region)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.4f\t%d\t%d\t%.4f\t%d\t%s\t\n",
			cmp.Or(s.Cohort, "total"), s.Groups, s.CommittedGroups, s.SupersededGroups, s.ControlGroups, s.Hedged.P50, s.Hedged.P99, s.Hedged.P999,
			s.Control.P50, s.Control.P99, s.Control.P999, s.DuplicateRate, s.Usage.Winners, s.Usage.Losers,
			s.ExtraCostRatio, s.LateCompletions, observedCell(s))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	var b strings.Builder
	withheld := map[string]bool{} // operation classes of cohorts whose gain is withheld
	fmt.Fprintf(&b, "\nlatencies in ms (first byte of streams, commit otherwise; failures at the deadline); %d records", r.Records)
	if r.OrphanAttempts > 0 {
		fmt.Fprintf(&b, ", %d attempt records without their group's record (not counted)", r.OrphanAttempts)
	}
	if len(r.Regions) > 0 {
		fmt.Fprintf(&b, "; %d regions", len(r.Regions))
	}
	fmt.Fprintf(&b, "\n%d user actions, %d committed more than once (superseded commits apart)\n", r.UserActions, r.CommittedTwice)
	for _, rw := range rows {
		s := rw.s
		name := cmp.Or(s.Cohort, "total")
		if rw.region != all {
			name = rw.region + " " + name
		}
		fmt.Fprintf(&b, "%s:\n", name)
		if g := s.Gain; g != nil {
			fmt.Fprintf(&b, "  tail gain (control P99 / hedged P99): %.3f, 95%% bootstrap interval [%.3f, %.3f] (hedged n=%d, control n=%d, %d resamples, seed %d)\n",
				g.Ratio, g.Lower, g.Upper, g.HedgedSamples, g.ControlSamples, g.Resamples, g.Seed)
		} else {
			fmt.Fprintf(&b, "  tail gain withheld: %s\n", s.GainWithheld)
			if n := s.GainNeeds; n != nil {
				b.WriteString("    " + n.describe() + "\n")
				if s.Cohort != "" {
					class, _, _ := strings.Cut(s.Cohort, "/")
					withheld[class] = true
				}
			}
		}
		if s.SupersededGroups > 0 {
			fmt.Fprintf(&b, "  superseded by a takeover: %d groups, %d usage units (paid, in extra cost)\n",
				s.SupersededGroups, s.Usage.Superseded)
		}
		fmt.Fprintf(&b, "  suppressed: %s\n", counts(s.Suppressed))
		fmt.Fprintf(&b, "  guardrail: %s\n", counts(s.Guardrail))
	}
	if len(withheld) > 0 {
		b.WriteString(soonerNote(slices.Sorted(maps.Keys(withheld))))
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// describe says how many more groups each arm needs and how many groups
// that takes at the observed control share and at the evaluation share.
func (n *SampleNeed) describe() string {
	var arms []string
	if n.HedgedMore > 0 {
		arms = append(arms, fmt.Sprintf("%d more hedged", n.HedgedMore))
	}
	if n.ControlMore > 0 {
		arms = append(arms, fmt.Sprintf("%d more control", n.ControlMore))
	}
	need := "needs " + strings.Join(arms, " and ") + " groups: "
	if n.GroupsMore == 0 {
		return need + fmt.Sprintf("no control group yet to count a share from; about %d more groups at a control share of %.0f%%",
			n.GroupsMoreAtEvaluation, 100*n.EvaluationShare)
	}
	return need + fmt.Sprintf("about %d more groups at this control share (%.1f%%), about %d at a control share of %.0f%%",
		n.GroupsMore, 100*n.ControlShare, n.GroupsMoreAtEvaluation, 100*n.EvaluationShare)
}

// soonerNote says how to reach the sample floor sooner, and what it costs,
// for the operation classes whose gain is withheld.
func soonerNote(classes []string) string {
	keys := make([]string, len(classes))
	for i, c := range classes {
		keys[i] = "policies." + c + ".control_fraction"
	}
	return fmt.Sprintf("\nevidence sooner: for an evaluation period, raise %s (default 0.01) to %g and reload\n"+
		"(SIGHUP); set it back once the gain is out. Control groups hedge as any group does, so callers\n"+
		"wait no longer; the cost is tokens: a control group whose hedge wins keeps its primary running\n"+
		"to its own commit point (docs/architecture.md §5, \"Control fraction\").\n",
		strings.Join(keys, ", "), EvaluationControlShare)
}

func observedCell(s Section) string {
	if s.CancellationsSent == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f of %d", s.CancellationObservedRatio, s.CancellationsSent)
}

// counts prints a count per key, keys sorted; "none" for none.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
