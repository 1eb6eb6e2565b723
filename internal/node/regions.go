package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets/lease"
	"github.com/hedgerow/hedgerow/budgets/lease/natslease"
	"github.com/hedgerow/hedgerow/budgets/lease/redislease"
	"github.com/hedgerow/hedgerow/internal/config"
)

// openRegion is the gateway's side of its region's leases of the global
// ceilings (docs/architecture.md §14), started, or nil when the
// configuration names no regions. The region's store is its Redis (memory
// without one: a region of one gateway); the authority is the leases'
// bucket on nc's JetStream, bound at its first use.
func openRegion(cfg *config.Config, nc *nats.Conn, client redis.UniversalClient, reg prometheus.Registerer, log *slog.Logger) (*lease.Region, error) {
	if len(cfg.Global.Regions) == 0 {
		return nil, nil
	}
	if nc == nil {
		return nil, errors.New("global ceilings: a NATS connection is required (the leases' authority is a JetStream bucket)")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("global ceilings: %w", err)
	}
	a := cfg.Global.Authority
	auth := &boundLater{bind: func(ctx context.Context) (lease.Authority, error) {
		return natslease.New(ctx, js, natslease.Options{Bucket: a.Bucket, Placement: a.Placement, Replicas: a.Replicas})
	}}
	var store lease.RegionStore = lease.NewMemoryRegion(nil)
	if client != nil {
		if store, err = redislease.New(client, redislease.Options{Prefix: cfg.Redis.KeyPrefix}); err != nil {
			return nil, fmt.Errorf("global ceilings: %w", err)
		}
	}
	region, err := lease.NewRegion(store, auth, lease.RegionOptions{
		Region: cfg.Deployment.Region, Lease: cfg.LeaseOptions(), Interval: cfg.Global.RebalanceInterval,
		Global: cfg.GlobalCeiling, Registerer: reg, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("global ceilings: %w", err)
	}
	region.Start()
	return region, nil
}

// boundLater is the leases' authority bound at its first use, and again at
// every use until it binds: a gateway that starts cut off from the
// bucket's region serves on its safe share and binds once the link is back
// (docs/architecture.md §14, "The authority").
type boundLater struct {
	bind func(context.Context) (lease.Authority, error)

	mu   sync.Mutex
	auth lease.Authority
}

func (b *boundLater) authority(ctx context.Context) (lease.Authority, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.auth == nil {
		auth, err := b.bind(ctx)
		if err != nil {
			return nil, err
		}
		b.auth = auth
	}
	return b.auth, nil
}

// Get implements lease.Authority.
func (b *boundLater) Get(ctx context.Context, key string) (lease.Table, uint64, error) {
	auth, err := b.authority(ctx)
	if err != nil {
		return lease.Table{}, 0, err
	}
	return auth.Get(ctx, key)
}

// Put implements lease.Authority.
func (b *boundLater) Put(ctx context.Context, key string, t lease.Table, rev uint64) (uint64, error) {
	auth, err := b.authority(ctx)
	if err != nil {
		return 0, err
	}
	return auth.Put(ctx, key, t, rev)
}
