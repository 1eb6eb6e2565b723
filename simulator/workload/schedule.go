package workload

import (
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"time"
)

// Episode is one degraded interval [Start, End) of a route, in model time.
type Episode struct {
	Start, End time.Duration
}

// schedule is the degraded-episode timeline of every route of a degrading
// model, generated lazily as queries reach further into the future. It is a
// deterministic function of the seed: generation consumes one random stream
// in event order, whatever order the queries come in.
//
// Construction (common shock on a memoryless onset): each route alternates
// healthy → degraded → healthy. A healthy route's onsets form a Poisson
// process of rate λ = 1/(MeanCycle − mean episode), so its healthy sojourn is
// exponential with mean MeanCycle − mean episode (3 min for the built-in
// model), and each episode lasts U(MinEpisode, MaxEpisode). That process is
// split into two independent Poisson processes: a private one per route, of
// rate (1−CommonShare)·λ, and a common one of rate CommonShare·λ shared by
// all routes. A common shock degrades every route that is healthy at that
// instant, for one shared duration; a route already degraded ignores it. By
// memorylessness the superposition is still rate λ for every healthy route,
// so each route on its own is exactly the specified chain (stationary
// fraction mean episode / MeanCycle = 0.4), while routes hit by the same shock
// are degraded together, which is what correlates them. CommonShare is
// calibrated numerically to give the target pairwise correlation.
type schedule struct {
	mu sync.Mutex

	rand                    *rand.Rand
	commonRate              float64 // onsets per second
	privateRate             float64
	minEpisode, episodeSpan float64 // seconds

	now        float64 // seconds; all onsets before now are generated
	nextCommon float64
	routes     []routeChain
}

type routeChain struct {
	degraded    bool
	until       float64 // end of the current episode, when degraded
	nextPrivate float64 // next private onset, when healthy
	episodes    []Episode
}

func newSchedule(d *Degradation, seed uint64) *schedule {
	healthyMean := (d.MeanCycle - d.meanEpisode()).Seconds()
	rate := 1 / healthyMean
	s := &schedule{
		rand:        newRand(seed, domainSchedule),
		commonRate:  d.CommonShare * rate,
		privateRate: (1 - d.CommonShare) * rate,
		minEpisode:  d.MinEpisode.Seconds(),
		episodeSpan: (d.MaxEpisode - d.MinEpisode).Seconds(),
		now:         -d.WarmUp.Seconds(),
		routes:      make([]routeChain, d.Routes),
	}
	// Every route starts healthy at -WarmUp; the warm-up makes the chain
	// (close to) stationary by time 0.
	s.nextCommon = s.after(s.commonRate)
	for i := range s.routes {
		s.routes[i].nextPrivate = s.after(s.privateRate)
	}
	return s
}

// after returns now plus an exponential wait at the given rate (never when
// the rate is zero).
func (s *schedule) after(rate float64) float64 {
	if rate <= 0 {
		return math.Inf(1)
	}
	return s.now + s.rand.ExpFloat64()/rate
}

func (s *schedule) episodeLength() float64 {
	return s.minEpisode + s.episodeSpan*s.rand.Float64()
}

func seconds(x float64) time.Duration { return time.Duration(math.Round(x * 1e9)) }

// extend generates every onset at or before t (seconds).
func (s *schedule) extend(t float64) {
	for {
		next, route, kind := s.nextEvent()
		if next > t {
			return
		}
		s.now = next
		switch kind {
		case eventCommon:
			length := s.episodeLength()
			for i := range s.routes {
				if !s.routes[i].degraded {
					s.begin(i, length)
				}
			}
			s.nextCommon = s.after(s.commonRate)
		case eventPrivate:
			s.begin(route, s.episodeLength())
		case eventRecover:
			r := &s.routes[route]
			r.degraded = false
			r.nextPrivate = s.after(s.privateRate)
		}
	}
}

type eventKind int

const (
	eventCommon eventKind = iota
	eventPrivate
	eventRecover
)

func (s *schedule) nextEvent() (float64, int, eventKind) {
	next, route, kind := s.nextCommon, -1, eventCommon
	for i := range s.routes {
		r := &s.routes[i]
		if r.degraded && r.until < next {
			next, route, kind = r.until, i, eventRecover
		} else if !r.degraded && r.nextPrivate < next {
			next, route, kind = r.nextPrivate, i, eventPrivate
		}
	}
	return next, route, kind
}

func (s *schedule) begin(route int, length float64) {
	r := &s.routes[route]
	r.degraded = true
	r.until = s.now + length
	r.episodes = append(r.episodes, Episode{Start: seconds(s.now), End: seconds(r.until)})
}

// degraded reports whether the route is degraded at model time at.
func (s *schedule) degraded(route int, at time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.extend(at.Seconds())
	eps := s.routes[route].episodes
	// The last episode that starts at or before at is the only candidate:
	// a route's episodes never overlap.
	i := sort.Search(len(eps), func(i int) bool { return eps[i].Start > at }) - 1
	return i >= 0 && at < eps[i].End
}

// episodes returns a copy of the route's episodes that overlap [0, until).
func (s *schedule) episodes(route int, until time.Duration) []Episode {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.extend(until.Seconds())
	var out []Episode
	for _, e := range s.routes[route].episodes {
		if e.End > 0 && e.Start < until {
			out = append(out, e)
		}
	}
	return out
}
