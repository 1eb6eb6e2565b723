package node

import (
	"fmt"
	"maps"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// natsCollector exports, at each scrape, the state of a process's NATS
// connections by role (gateway, workers): whether each is connected and how
// often it reconnected (docs/architecture.md §9). A gateway cut off from
// NATS reaches no worker, and a worker takes no attempt; the dashboard and
// the alert rules of deploy/ read these.
type natsCollector struct {
	conns                 map[string]*nats.Conn
	connected, reconnects *prometheus.Desc
}

func newNATSCollector(conns map[string]*nats.Conn) *natsCollector {
	return &natsCollector{conns: conns,
		connected: prometheus.NewDesc("hedgerow_nats_connected",
			"1 while the process's NATS connection of this role (gateway, workers) is connected, 0 while it is not (reconnecting, closed).",
			[]string{"conn"}, nil),
		reconnects: prometheus.NewDesc("hedgerow_nats_reconnects_total",
			"Times the process's NATS connection of this role reconnected since it started.",
			[]string{"conn"}, nil),
	}
}

// registerNATS registers the collector of conns with reg.
func registerNATS(reg prometheus.Registerer, conns map[string]*nats.Conn) error {
	if err := reg.Register(newNATSCollector(conns)); err != nil {
		return fmt.Errorf("nats metrics: %w", err)
	}
	return nil
}

// Describe implements prometheus.Collector.
func (c *natsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.connected
	ch <- c.reconnects
}

// Collect implements prometheus.Collector.
func (c *natsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, role := range slices.Sorted(maps.Keys(c.conns)) {
		nc := c.conns[role]
		up := 0.0
		if nc.IsConnected() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, up, role)
		ch <- prometheus.MustNewConstMetric(c.reconnects, prometheus.CounterValue, float64(nc.Stats().Reconnects), role)
	}
}
