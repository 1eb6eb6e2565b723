package storetest

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// The suite's duplicate-rate window: short, so that sliding it takes
// advances of about a second.
const (
	dupWindow = time.Second
	dupSlots  = 10
	dupSlot   = dupWindow / dupSlots
)

// ceilingOf is the suite's window with ceiling c and no reserve.
func ceilingOf(c float64) budgets.DuplicateCeiling {
	return budgets.DuplicateCeiling{Ceiling: c, Window: dupWindow, Slots: dupSlots}
}

// primaries admits n primaries, each of a user action of its own, into
// cohort c of the suite's pool.
func (f *fixture) primaries(c string, dup budgets.DuplicateCeiling, n int) {
	f.t.Helper()
	for range n {
		req := primary(f.fresh("ua"))
		req.Window, req.Duplicates = c, dup
		if a := f.admit(req); !a.Allowed {
			f.t.Fatalf("cohort %s: primary refused (%s)", c, a.Reason)
		}
	}
}

// hedgesAvailableIn counts the hedges cohort c grants before the first
// duplicate-rate denial, each from a user action of its own. The grants are
// settled, so they stay counted.
func (f *fixture) hedgesAvailableIn(c string, dup budgets.DuplicateCeiling, reserve budgets.ReserveBucket, limit int) int {
	f.t.Helper()
	for n := 0; n <= limit; n++ {
		req := hedge(f.fresh("hedge"))
		req.Window, req.Duplicates, req.Reserve = c, dup, reserve
		g := f.extra(req)
		if !g.Allowed {
			f.wantGrant(fmt.Sprintf("cohort %s hedge %d", c, n+1), g, budgets.ReasonDuplicateRate)
			return n
		}
		f.settle(g.Reservation, 0)
	}
	f.t.Fatalf("cohort %s: more than %d hedges granted", c, limit)
	return limit
}

// extraIn asks for an extra attempt of role in cohort c under dup, from a
// user action of its own.
func (f *fixture) extraIn(role schemas.Role, c string, dup budgets.DuplicateCeiling) budgets.Grant {
	f.t.Helper()
	req := extra(role, f.fresh("ua"))
	req.Window, req.Duplicates = c, dup
	return f.extra(req)
}

func testHedgeIsAllowedOnlyUnderTheWindowCeiling(f *fixture) {
	tests := []struct {
		name      string
		ceiling   float64
		primaries int
		hedges    int
	}{
		{"no primaries, no hedge", 0.5, 0, 0},
		{"a ceiling of 0 never hedges", 0, 10, 0},
		{"one primary at ceiling 1 earns one hedge", 1, 1, 1},
		{"half a hedge is no hedge", 0.5, 1, 0},
		{"two halves make one", 0.5, 2, 1},
		{"twelve primaries at 8% earn 0.96 of a hedge", 0.08, 12, 0},
		{"thirteen earn one", 0.08, 13, 1},
		{"a hundred earn eight", 0.08, 100, 8},
		{"ten tenths make exactly one", 0.1, 10, 1},
		{"twenty twentieths make exactly one", 0.05, 20, 1},
		{"nineteen twentieths make none", 0.05, 19, 0},
	}
	for i, tt := range tests {
		c := fmt.Sprintf("cohort-%d", i)
		f.primaries(c, ceilingOf(tt.ceiling), tt.primaries)
		if got := f.hedgesAvailableIn(c, ceilingOf(tt.ceiling), budgets.ReserveBucket{}, tt.primaries+1); got != tt.hedges {
			f.t.Errorf("%s: %d hedges granted, want %d", tt.name, got, tt.hedges)
		}
	}
	f.primaries("cohort-token", ceilingOf(1), 1)
	if g := f.extraIn(schemas.RoleHedge, "cohort-token", ceilingOf(1)); g.Token != budgets.TokenCohort {
		f.t.Errorf("a hedge under the ceiling: token %q, want %q", g.Token, budgets.TokenCohort)
	}
}

// testBurstBoundCapsHedgesWithinTheWindowsRoom: with a burst bound, a
// hedge must fit both the window's ceiling and the burst ceiling over the
// window's last slots (docs/architecture.md §7, "two windows"); whichever
// is tighter refuses, and a replacement is refused by neither.
func testBurstBoundCapsHedgesWithinTheWindowsRoom(f *fixture) {
	twoWindows := func(ceiling, burstCeiling float64, burstSlots int) budgets.DuplicateCeiling {
		d := ceilingOf(ceiling)
		d.BurstSlots, d.BurstCeiling = burstSlots, burstCeiling
		return d
	}
	tight := twoWindows(0.1, 0.2, 2)   // the burst bound binds
	loose := twoWindows(0.1, 1, 2)     // the window's ceiling binds
	unbounded := twoWindows(0.1, 0, 0) // no burst bound: the window alone
	for slot := range 9 {
		if slot > 0 {
			f.clock.Advance(dupSlot)
		}
		f.primaries("tight", tight, 10)
		f.primaries("unbounded", unbounded, 10)
		if slot >= 7 {
			f.primaries("loose", loose, 10)
		}
	}
	// Slots 0–8 hold 90 primaries (room for 9 hedges at 10%); the last two
	// slots hold 20 (room for 4 at 20%).
	if got := f.hedgesAvailableIn("tight", tight, budgets.ReserveBucket{}, 10); got != 4 {
		f.t.Errorf("burst ceiling 20%% over 20 primaries in a window of 90 at 10%%: %d hedges, want 4", got)
	}
	if got := f.hedgesAvailableIn("unbounded", unbounded, budgets.ReserveBucket{}, 10); got != 9 {
		f.t.Errorf("no burst bound, 90 primaries at 10%%: %d hedges, want 9", got)
	}
	// 20 primaries in all, all in the burst slots: the window's 10% binds.
	if got := f.hedgesAvailableIn("loose", loose, budgets.ReserveBucket{}, 10); got != 2 {
		f.t.Errorf("burst ceiling 100%% over a window of 20 primaries at 10%%: %d hedges, want 2", got)
	}
	if g := f.extraIn(schemas.RoleReplacement, "tight", tight); !g.Allowed {
		f.t.Errorf("a replacement with the burst bound full: refused (%s)", g.Reason)
	}
	// Two slots on, the burst slots hold only slot 10's primaries; the
	// window still holds slots 1–8's and the 5 extra attempts counted.
	f.clock.Advance(2 * dupSlot)
	f.primaries("tight", tight, 10)
	if got := f.hedgesAvailableIn("tight", tight, budgets.ReserveBucket{}, 10); got != 2 {
		f.t.Errorf("burst slots of 10 fresh primaries at 20%% (window 90 primaries, 5 extras, at 10%%): %d hedges, want 2", got)
	}
}

// testBurstOfHedgesWithinAWindowIsAllowed: primaries arrive at a steady
// rate, one stall per window is hedged, and then a burst of stalls arrives
// in one slot. Every hedge of the burst that fits under the window's
// ceiling is granted at once, the next is refused, and the duplicate rate
// of every window of the run stays within the ceiling.
func testBurstOfHedgesWithinAWindowIsAllowed(f *fixture) {
	const (
		c         = "steady"
		perSlot   = 10 // primaries per slot: 100 per window
		ceiling   = 0.1
		reserve   = 2  // so hedges may take 10 − 2 = 8 per window
		burstSlot = 25 // the background hedge of this window came at slot 20
		burst     = 7  // 1 + 7 = 8 fit
		runSlots  = 40
	)
	// One stall a window is hedged in the background, once a whole window
	// of primaries is in (and the burst has left the window of slot 36).
	background := map[int]bool{10: true, 20: true, 36: true}
	dup := ceilingOf(ceiling)
	dup.ReplacementReserve = reserve
	primaries, hedges := make([]int, runSlots), make([]int, runSlots)
	for slot := range runSlots {
		if slot > 0 {
			f.clock.Advance(dupSlot)
		}
		f.primaries(c, dup, perSlot)
		primaries[slot] = perSlot
		want := 0
		switch {
		case slot == burstSlot:
			want = burst
		case background[slot]:
			want = 1
		}
		for i := range want {
			g := f.extraIn(schemas.RoleHedge, c, dup)
			if !g.Allowed {
				f.t.Fatalf("slot %d: stall %d of %d refused (%s) with %d hedges in the window of %d primaries",
					slot, i+1, want, g.Reason, windowSum(hedges, slot), windowSum(primaries, slot))
			}
			hedges[slot]++
		}
		if slot == burstSlot {
			f.wantGrant("the stall after the burst", f.extraIn(schemas.RoleHedge, c, dup), budgets.ReasonDuplicateRate)
		}
	}
	for end := dupSlots - 1; end < runSlots; end++ {
		h, p := windowSum(hedges, end), windowSum(primaries, end)
		if float64(h) > ceiling*float64(p) {
			f.t.Errorf("window ending at slot %d: %d hedges for %d primaries, above the ceiling %v", end, h, p, ceiling)
		}
	}
}

// windowSum is the sum of counts over the window of dupSlots slots that
// ends at slot end.
func windowSum(counts []int, end int) int {
	n := 0
	for s := max(0, end-dupSlots+1); s <= end; s++ {
		n += counts[s]
	}
	return n
}

func testHedgesLeaveTheReplacementReserve(f *fixture) {
	tests := []struct {
		name      string
		ceiling   float64
		reserve   float64
		primaries int
		steps     []schemas.Role // the last hedge of each run is refused
		granted   []bool
	}{
		{
			name: "hedges stop two short of the ceiling, replacements go on", ceiling: 1, reserve: 2, primaries: 5,
			steps:   []schemas.Role{schemas.RoleHedge, schemas.RoleHedge, schemas.RoleHedge, schemas.RoleHedge, schemas.RoleReplacement, schemas.RoleReplacement, schemas.RoleHedge},
			granted: []bool{true, true, true, false, true, true, false},
		},
		{
			name: "a fractional reserve", ceiling: 1, reserve: 0.5, primaries: 2,
			steps:   []schemas.Role{schemas.RoleHedge, schemas.RoleHedge},
			granted: []bool{true, false},
		},
		{
			name: "a reserve above the window's allowance leaves hedges none", ceiling: 0.1, reserve: 3, primaries: 30,
			steps:   []schemas.Role{schemas.RoleHedge, schemas.RoleReplacement},
			granted: []bool{false, true},
		},
	}
	for i, tt := range tests {
		c := fmt.Sprintf("reserve-%d", i)
		dup := ceilingOf(tt.ceiling)
		dup.ReplacementReserve = tt.reserve
		f.primaries(c, dup, tt.primaries)
		for j, role := range tt.steps {
			g := f.extraIn(role, c, dup)
			if g.Allowed != tt.granted[j] {
				f.t.Errorf("%s: step %d (%s): %+v, want allowed %v", tt.name, j+1, role, g, tt.granted[j])
			}
		}
	}
}

func testReplacementsAreNeverRefusedByTheCeilingButCount(f *fixture) {
	// A cold cohort, a ceiling of 0 and no reserve: a replacement goes all the same.
	for i := range 3 {
		g := f.extraIn(schemas.RoleReplacement, "cold", ceilingOf(0))
		if !g.Allowed || g.Token != budgets.TokenNone {
			f.t.Errorf("replacement %d in a cold cohort with a ceiling of 0: %+v, want allowed without a token", i+1, g)
		}
	}
	// Counted, a replacement leaves less room to hedges: two primaries at
	// ceiling 1 earn two extra attempts, one of which the replacement took.
	f.primaries("shared", ceilingOf(1), 2)
	if g := f.extraIn(schemas.RoleReplacement, "shared", ceilingOf(1)); !g.Allowed {
		f.t.Fatalf("replacement: %+v", g)
	}
	if got := f.hedgesAvailableIn("shared", ceilingOf(1), budgets.ReserveBucket{}, 3); got != 1 {
		f.t.Errorf("after one replacement of two earned extra attempts: %d hedges granted, want 1", got)
	}
	// And past the ceiling, replacements still go.
	if g := f.extraIn(schemas.RoleReplacement, "shared", ceilingOf(1)); !g.Allowed {
		f.t.Errorf("replacement in a window at its ceiling: %+v, want allowed", g)
	}
}

// testContinuationCountsInTheWindowIsNeverRefusedByTheCeilingAndTakesALedgerSlot:
// a continuation (issue 30: an attempt that continues a committed stream
// that broke) is counted as a replacement is (docs/architecture.md §7):
// in its cohort's window, so it leaves less room to hedges; never refused
// by the duplicate ceiling, drawing no token; and against the user
// action's ledger, whose Max its caller raises by the pool's rescues —
// once that Max is spent, a continuation is refused attempts.
func testContinuationCountsInTheWindowIsNeverRefusedByTheCeilingAndTakesALedgerSlot(f *fixture) {
	const c = "rescued"
	dup := ceilingOf(1)
	// The broken stream's user action: max_attempts 1, spent by its
	// primary, which with one other primary earns the window two extra
	// attempts at ceiling 1.
	broken := f.fresh("broken")
	first := primary(broken)
	first.Window, first.Duplicates, first.Attempts.Max = c, dup, 1
	if a := f.admit(first); !a.Allowed {
		f.t.Fatalf("the broken stream's primary: refused (%s)", a.Reason)
	}
	f.primaries(c, dup, 1)

	steps := []struct {
		name string
		req  budgets.ExtraRequest
		max  int
		dup  budgets.DuplicateCeiling
		want budgets.Reason
		used int // the grant's AttemptsUsed, when allowed
	}{
		{"a continuation takes the slot its rescue adds to a ledger its primary spent", continuation(broken), 2, dup, budgets.ReasonNone, 2},
		{"a hedge takes the one extra attempt the continuation left the window", hedge(f.fresh("ua")), 4, dup, budgets.ReasonNone, 1},
		{"the window counted the continuation: a third extra attempt is no hedge", hedge(f.fresh("ua")), 4, dup, budgets.ReasonDuplicateRate, 0},
		{"a continuation in a window past its ceiling still goes", continuation(f.fresh("ua")), 4, dup, budgets.ReasonNone, 1},
		{"a continuation in a cold cohort with a ceiling of 0 still goes", continuation(f.fresh("ua")), 4, ceilingOf(0), budgets.ReasonNone, 1},
		{"a continuation once the ledger's max is spent is refused attempts", continuation(broken), 2, dup, budgets.ReasonAttempts, 0},
	}
	for _, s := range steps {
		req := s.req
		req.Window, req.Duplicates, req.Attempts.Max = c, s.dup, s.max
		if s.dup.Ceiling == 0 {
			req.Window = "cold"
		}
		g := f.extra(req)
		f.wantGrant(s.name, g, s.want)
		if g.Allowed && g.AttemptsUsed != s.used {
			f.t.Errorf("%s: %d attempts used, want %d", s.name, g.AttemptsUsed, s.used)
		}
	}
}

func testWindowSlidesAndForgetsOldSlots(f *fixture) {
	dup := ceilingOf(1)
	steps := []struct {
		name      string
		advance   time.Duration
		primaries int
		hedges    int
	}{
		{"two primaries earn two hedges", 0, 2, 2},
		{"nine slots later they are still in the window", 9 * dupSlot, 0, 0},
		{"the tenth slot forgets them and their hedges", dupSlot, 1, 1},
		{"five slots later both slots count", 5 * dupSlot, 3, 3},
		{"another five forget the older slot", 5 * dupSlot, 0, 0},
		{"a slot of primaries earns its hedges", dupSlot, 2, 2},
	}
	for _, s := range steps {
		f.clock.Advance(s.advance)
		f.primaries("sliding", dup, s.primaries)
		if got := f.hedgesAvailableIn("sliding", dup, budgets.ReserveBucket{}, 10); got != s.hedges {
			f.t.Errorf("%s: %d hedges granted, want %d", s.name, got, s.hedges)
		}
	}
}

func testReleasedHedgeIsUncounted(f *fixture) {
	dup := ceilingOf(1)
	for _, role := range []schemas.Role{schemas.RoleHedge, schemas.RoleReplacement, schemas.RoleContinuation} {
		c := "released-" + string(role)
		f.primaries(c, dup, 1)
		g := f.extraIn(role, c, dup)
		f.wantGrant(string(role)+" on the window's one earned attempt", f.extraIn(schemas.RoleHedge, c, dup), budgets.ReasonDuplicateRate)
		f.release(g.Reservation)
		if again := f.extraIn(schemas.RoleHedge, c, dup); !again.Allowed || again.Token != budgets.TokenCohort {
			f.t.Errorf("hedge after a released %s: %+v, want its count given back", role, again)
		}
	}
	// A release after its slot left the window takes nothing from the
	// slots that count now.
	f.primaries("late", dup, 1)
	g := f.extraIn(schemas.RoleHedge, "late", dup)
	f.clock.Advance(dupWindow)
	f.primaries("late", dup, 1)
	f.release(g.Reservation)
	if got := f.hedgesAvailableIn("late", dup, budgets.ReserveBucket{}, 3); got != 1 {
		f.t.Errorf("after releasing a hedge whose slot left the window: %d hedges granted, want 1", got)
	}
}

// testCeilingHoldsOverEveryWindowOfASeededSequence drives one cohort with a
// long seeded sequence of primaries, hedges (single and in bursts),
// replacements and releases at uneven times, and checks every decision
// against a model of the window, and every window against the guarantee
// of docs/architecture.md §7: at the last hedge of any slot, the hedges
// of the window that ends there, plus the reserve, are within ceiling ×
// its primaries; so a window's hedges are within the ceiling of the
// primaries of the window and the one before it.
func testCeilingHoldsOverEveryWindowOfASeededSequence(f *fixture) {
	const (
		c       = "seeded"
		steps   = 2500
		ceiling = 0.3
		reserve = 1
	)
	dup := ceilingOf(ceiling)
	dup.ReplacementReserve = reserve
	rng := rand.New(rand.NewPCG(14, 6))
	slotOf := func() int64 { return budgets.WindowSlot(f.clock.Now(), dupSlot) }
	first := slotOf()

	// The model: per slot, primaries and counted extras; hedges as well.
	type counts struct{ primaries, extras, hedges int64 }
	model := map[int64]*counts{}
	at := func(s int64) *counts {
		if model[s] == nil {
			model[s] = &counts{}
		}
		return model[s]
	}
	window := func(end int64) (p, x, h int64) {
		for s := end - dupSlots + 1; s <= end; s++ {
			if k := model[s]; k != nil {
				p, x, h = p+k.primaries, x+k.extras, h+k.hedges
			}
		}
		return p, x, h
	}
	type held struct {
		id    budgets.ReservationID
		slot  int64
		hedge bool
	}
	var holding []held
	var granted, refused, replaced, released, bursts int

	ask := func(role schemas.Role) {
		now := slotOf()
		p, x, _ := window(now)
		want := role == schemas.RoleReplacement || dup.AllowsHedge(p, x)
		g := f.extraIn(role, c, dup)
		if g.Allowed != want {
			f.t.Fatalf("%s at slot %d with %d primaries and %d extras in the window: allowed %v, the window allows %v",
				role, now-first, p, x, g.Allowed, want)
		}
		if !g.Allowed {
			refused++
			return
		}
		at(now).extras++
		if role == schemas.RoleHedge {
			at(now).hedges++
			granted++
		} else {
			replaced++
		}
		holding = append(holding, held{id: g.Reservation, slot: now, hedge: role == schemas.RoleHedge})
	}
	for range steps {
		f.clock.Advance(time.Duration(rng.IntN(40)) * time.Millisecond)
		switch r := rng.IntN(100); {
		case r < 70:
			f.primaries(c, dup, 1)
			at(slotOf()).primaries++
		case r < 85:
			ask(schemas.RoleHedge)
		case r < 88:
			bursts++
			for range 2 + rng.IntN(6) {
				ask(schemas.RoleHedge)
			}
		case r < 93:
			ask(schemas.RoleReplacement)
		case len(holding) > 0:
			i := rng.IntN(len(holding))
			h := holding[i]
			holding = append(holding[:i], holding[i+1:]...)
			if rng.IntN(2) == 0 {
				f.settle(h.id, 1)
				continue
			}
			f.release(h.id)
			released++
			if h.slot > slotOf()-dupSlots { // still in the window: uncounted
				at(h.slot).extras--
				if h.hedge {
					at(h.slot).hedges--
				}
			}
		}
	}
	if granted == 0 || refused == 0 || replaced == 0 || released == 0 || bursts == 0 {
		f.t.Fatalf("the sequence granted %d hedges, refused %d, replaced %d, released %d in %d bursts: it exercised too little",
			granted, refused, replaced, released, bursts)
	}
	last := slotOf()
	for end := first; end <= last; end++ {
		p, _, h := window(end)
		if k := model[end]; k != nil && k.hedges > 0 && float64(h)+reserve > ceiling*float64(p)+1e-9 {
			f.t.Errorf("window ending at slot %d (holding a hedge): %d hedges + reserve %v for %d primaries, above the ceiling %v",
				end-first, h, float64(reserve), p, ceiling)
		}
		before, _, _ := window(end - dupSlots)
		if float64(h) > ceiling*float64(p+before)+1e-9 {
			f.t.Errorf("window ending at slot %d: %d hedges above the ceiling of its %d primaries and the %d of the window before",
				end-first, h, p, before)
		}
	}
}

func testPoolReserveLetsLowTrafficHedge(f *fixture) {
	reserve := budgets.ReserveBucket{Capacity: 1, RefillPerSecond: 1}
	dup := ceilingOf(1)
	f.primaries("quiet", dup, 1)
	f.primaries("quieter", dup, 1)
	steps := []struct {
		name    string
		cohort  string
		advance time.Duration
		want    budgets.Reason
		source  budgets.TokenSource
	}{
		{"the cohort's own window goes first", "quiet", 0, budgets.ReasonNone, budgets.TokenCohort},
		{"then the pool's reserve pays", "quiet", 0, budgets.ReasonNone, budgets.TokenReserve},
		{"an empty reserve refuses", "quiet", 0, budgets.ReasonDuplicateRate, budgets.TokenNone},
		{"the reserve is the pool's, not the cohort's", "quieter", 0, budgets.ReasonNone, budgets.TokenCohort},
		{"another full cohort shares the empty reserve", "quieter", 0, budgets.ReasonDuplicateRate, budgets.TokenNone},
		{"the reserve refills over time", "quiet", 1100 * time.Millisecond, budgets.ReasonNone, budgets.TokenReserve},
	}
	for _, s := range steps {
		f.clock.Advance(s.advance)
		req := hedge(f.fresh("ua"))
		req.Window, req.Duplicates, req.Reserve = s.cohort, dup, reserve
		g := f.extra(req)
		f.wantGrant(s.name, g, s.want)
		if g.Token != s.source {
			f.t.Errorf("%s: token from %q, want %q", s.name, g.Token, s.source)
		}
	}
	// A hedge the reserve paid is counted in its cohort's window too: the
	// primary that follows earns no hedge, the reserve-paid one it shares
	// the window with having taken its room.
	f.primaries("quiet", dup, 1)
	if got := f.hedgesAvailableIn("quiet", dup, budgets.ReserveBucket{}, 3); got != 0 {
		f.t.Errorf("after a reserve-paid hedge: %d hedges granted, want 0", got)
	}
}
