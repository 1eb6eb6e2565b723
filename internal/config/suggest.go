package config

import "unicode/utf8"

// closestKey returns the known key an unknown one was most likely meant to
// be — the nearest by edit distance, if it is near enough that a typo
// explains it (at most a third of the key's length, and at least one edit) —
// or "" when none is. Ties go to the first in known's order.
func closestKey(unknown string, known []string) string {
	limit := max(1, utf8.RuneCountInString(unknown)/3)
	best, bestDist := "", limit+1
	for _, k := range known {
		if d := editDistance(unknown, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b: the fewest
// insertions, deletions and substitutions of a rune that turn a into b.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev, cur := make([]int, len(rb)+1), make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
