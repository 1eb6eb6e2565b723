package replay

import "github.com/prometheus/client_golang/prometheus/testutil"

// Crash stops the lead as a killed gateway would: its lease is no longer
// refreshed, and neither an answer nor a release ever reaches the store.
func (l *Lead) Crash() {
	l.ended = true
	close(l.stop)
	l.beat.Wait()
	l.fs.leave(l.key, l.flight)
}

// NotKeptCount is the counter of answers not kept for reason.
func (m *Metrics) NotKeptCount(reason string) float64 {
	return testutil.ToFloat64(m.notKept.WithLabelValues(reason))
}
