package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/internal/adapters/records"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/schemas"
)

// NATSURLs are the cluster's NATS client URLs (TLS).
func (m *Manifest) NATSURLs() string {
	var urls []string
	for _, port := range m.Spec.Ports.NATS {
		urls = append(urls, "tls://"+addr(port))
	}
	return strings.Join(urls, ",")
}

// GatewayURL is the i-th gateway's API (from 0).
func (m *Manifest) GatewayURL(i int) string { return "http://" + addr(m.Spec.Ports.Gateways[i]) }

// ProxyControlURL is the control API of the fault proxy between the first
// gateway and Redis.
func (m *Manifest) ProxyControlURL() string { return "http://" + addr(m.Spec.Ports.RedisProxyControl) }

// Connect connects to the cluster's NATS as user (natsauth's names:
// observer to read the records), with its nkey, its certificate and its
// inbox prefix.
func (m *Manifest) Connect(user string, opts ...nats.Option) (*nats.Conn, error) {
	auth := filepath.Join(m.Spec.Dir, authDir)
	tlsDir := filepath.Join(auth, natsauth.TLSDir)
	seed, err := nats.NkeyOptionFromSeed(filepath.Join(auth, user+".nk"))
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	prefix := map[string]string{
		natsauth.UserObserver: schemas.ObserverInboxPrefix,
		natsauth.UserGateway:  schemas.GatewayInboxPrefix,
		natsauth.UserWorker:   schemas.WorkerInboxPrefix,
		natsauth.UserClient:   schemas.ClientInbox(natsauth.UserClient),
	}[user]
	own := []nats.Option{seed, nats.Name("hedgerow-cluster-" + user),
		nats.RootCAs(filepath.Join(tlsDir, natsauth.CAFile)),
		nats.ClientCert(filepath.Join(tlsDir, natsauth.ClientCertFile(user)), filepath.Join(tlsDir, natsauth.ClientKeyFile(user)))}
	if prefix != "" {
		own = append(own, nats.CustomInboxPrefix(prefix))
	}
	nc, err := nats.Connect(m.NATSURLs(), append(own, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("cluster: connect as %s: %w", user, err)
	}
	return nc, nil
}

// waitStreams waits until every JetStream stream the gateways use answers
// its info (it has a leader) or is known not to exist yet. After the whole
// cluster restarts on its stores, a stream's group elects its leader some
// seconds after the servers report healthy; a gateway started meanwhile
// fails to open its gate bucket.
func (m *Manifest) waitStreams(ctx context.Context) error {
	if len(m.Spec.Ports.NATS) < 2 {
		return nil
	}
	nc, err := m.Connect(natsauth.UserGateway)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	for _, name := range []string{"KV_" + arbiter.DefaultLedgerBucket, records.DefaultStream} {
		for {
			ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := js.Stream(ictx, name)
			cancel()
			if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("cluster: JetStream stream %s has no leader: %w", name, err)
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}
