package workload

import "math/rand/v2"

// Domains keep the random streams of different kinds of draws apart, so that
// request 7 and attempt 7 of the same seed never share numbers.
const (
	domainRequest uint64 = iota + 1
	domainAttempt
	domainSchedule
	domainArrivals
)

// splitmix64 is a bijective 64-bit finaliser with good avalanche: each input
// bit flips about half the output bits, so nearby keys get unrelated streams.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// newRand returns a PCG stream that is a pure function of the seed, the
// domain and the parts that identify the draw.
func newRand(seed, domain uint64, parts ...uint64) *rand.Rand {
	h := splitmix64(seed ^ splitmix64(domain))
	for _, p := range parts {
		h = splitmix64(h ^ p)
	}
	return rand.New(rand.NewPCG(h, splitmix64(h^0x5851f42d4c957f2d)))
}
