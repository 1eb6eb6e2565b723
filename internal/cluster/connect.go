package cluster

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/natsauth"
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
		natsauth.UserObserver: natsauth.ObserverInboxPrefix,
		natsauth.UserGateway:  natsauth.GatewayInboxPrefix,
		natsauth.UserServe:    natsauth.GatewayInboxPrefix,
		natsauth.UserWorker:   natsauth.WorkerInboxPrefix,
		natsauth.UserClient:   natsauth.ClientInbox(natsauth.UserClient),
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
