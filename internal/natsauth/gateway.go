package natsauth

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Gateway links (docs/architecture.md §13, "Gateway links"): the
// nats-server gateway block that joins a region's cluster to the other
// regions' as a supercluster. The links carry every region's traffic,
// leases included, so they are encrypted and authenticated as client
// connections are: TLS with the deployment's server certificate both ways
// (the CA every region's certificates come from; verify: a server without
// a certificate the CA signed is refused) and a link user whose password
// every region's servers share — each server accepts it and presents it
// when it dials the others.
const (
	// GatewayConfigFile is the gateway block a region's nats-server
	// configuration includes. It holds the link password: a secret (0600).
	GatewayConfigFile = "nats-server-gateway.conf"
	// GatewayPasswordFile holds the link password alone, for the next
	// region's nats-auth (--from).
	GatewayPasswordFile = "gateway-link.password"
	// GatewayUser is the link user's name.
	GatewayUser = "gateway-link"
)

// GatewaySpec asks for a region's gateway block.
type GatewaySpec struct {
	// Name is the region's cluster name in the supercluster; empty:
	// Spec.Region.
	Name string
	// Listen is the host:port the server takes links on; Advertise,
	// when set, the host:port it tells the other regions to dial instead
	// (a proxy, a load balancer, a public address).
	Listen, Advertise string
	// Remotes are the other regions' gateways this server dials.
	Remotes []GatewayRemote
	// Password is the deployment's link password (ReadGatewayPassword of
	// the first region's directory); nil draws one, for a first region.
	Password []byte
}

// GatewayRemote is another region's cluster and the host:port (or
// nats://host:port) addresses of its gateways.
type GatewayRemote struct {
	Name string
	URLs []string
}

// GatewayLinks is a generated gateway block and its link password.
type GatewayLinks struct {
	Spec     GatewaySpec
	Password []byte
}

// ReadGatewayPassword reads the link password an earlier region's bundle
// wrote into dir.
func ReadGatewayPassword(dir string) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(dir, GatewayPasswordFile))
	if err != nil {
		return nil, fmt.Errorf("natsauth: the deployment's gateway-link password: %w", err)
	}
	pw := []byte(strings.TrimSpace(string(data)))
	if len(pw) == 0 {
		return nil, fmt.Errorf("natsauth: %s is empty", GatewayPasswordFile)
	}
	return pw, nil
}

func newGatewayLinks(spec GatewaySpec, region string) (*GatewayLinks, error) {
	if spec.Name == "" {
		spec.Name = region
	}
	if !userName.MatchString(spec.Name) {
		return nil, fmt.Errorf("natsauth: gateway name %q is not a token of [a-z0-9_-] (the region's name)", spec.Name)
	}
	if _, _, err := net.SplitHostPort(spec.Listen); err != nil {
		return nil, fmt.Errorf("natsauth: gateway listen address %q: want host:port", spec.Listen)
	}
	if _, _, err := net.SplitHostPort(spec.Advertise); spec.Advertise != "" && err != nil {
		return nil, fmt.Errorf("natsauth: gateway advertise address %q: want host:port", spec.Advertise)
	}
	seen := map[string]bool{spec.Name: true}
	spec.Remotes = slices.Clone(spec.Remotes)
	for i, r := range spec.Remotes {
		if !userName.MatchString(r.Name) || seen[r.Name] {
			return nil, fmt.Errorf("natsauth: gateway remote %q: a region's name, once, not this region's", r.Name)
		}
		seen[r.Name] = true
		if len(r.URLs) == 0 {
			return nil, fmt.Errorf("natsauth: gateway remote %s has no address", r.Name)
		}
		urls := make([]string, len(r.URLs))
		for j, u := range r.URLs {
			hostPort := strings.TrimPrefix(u, "nats://")
			if _, _, err := net.SplitHostPort(hostPort); err != nil || strings.Contains(hostPort, "@") {
				return nil, fmt.Errorf("natsauth: gateway remote %s address %q: want host:port, without credentials", r.Name, u)
			}
			urls[j] = "nats://" + hostPort
		}
		spec.Remotes[i].URLs = urls
	}
	pw := spec.Password
	if len(pw) == 0 {
		raw := make([]byte, passwordBytes)
		if _, err := rand.Read(raw); err != nil {
			return nil, fmt.Errorf("natsauth: gateway-link password: %w", err)
		}
		pw = []byte(fmt.Sprintf("%x", raw))
	}
	spec.Password = nil
	return &GatewayLinks{Spec: spec, Password: pw}, nil
}

// Config is the gateway block for a bundle written in dir (its TLS files
// named by absolute path). The server presents the link password it
// accepts when it dials the other regions, so the remotes' URLs carry no
// credentials.
func (g *GatewayLinks) Config(dir string) (string, error) {
	tlsDir, err := filepath.Abs(filepath.Join(dir, TLSDir))
	if err != nil {
		return "", fmt.Errorf("natsauth: gateway: %w", err)
	}
	var s strings.Builder
	s.WriteString("# The gateway links of this region to the others, written by `hedgerow nats-auth`\n")
	s.WriteString("# (docs/architecture.md §13, \"Gateway links\"). It holds the link password: keep it 0600.\n")
	fmt.Fprintf(&s, "gateway {\n  name: %s\n  listen: %s\n", strconv.Quote(g.Spec.Name), strconv.Quote(g.Spec.Listen))
	if g.Spec.Advertise != "" {
		fmt.Fprintf(&s, "  advertise: %s\n", strconv.Quote(g.Spec.Advertise))
	}
	s.WriteString("  # The deployment's server certificate both ways; the other side's must be the CA's.\n  ")
	s.WriteString(tlsBlock(tlsDir, "  "))
	s.WriteString("  # What this server accepts, and presents when it dials.\n")
	fmt.Fprintf(&s, "  authorization { user: %s, password: %s, timeout: 2 }\n", strconv.Quote(GatewayUser), strconv.Quote(string(g.Password)))
	s.WriteString("  gateways: [\n")
	for _, r := range g.Spec.Remotes {
		q := make([]string, len(r.URLs))
		for i, u := range r.URLs {
			q[i] = strconv.Quote(u)
		}
		fmt.Fprintf(&s, "    {name: %s, urls: [%s]}\n", strconv.Quote(r.Name), strings.Join(q, ", "))
	}
	s.WriteString("  ]\n}\n")
	return s.String(), nil
}

// write puts the gateway block and the link password into dir (0600,
// never overwriting).
func (g *GatewayLinks) write(dir string) error {
	if g == nil {
		return errors.New("natsauth: gateway: nothing generated")
	}
	conf, err := g.Config(dir)
	if err != nil {
		return err
	}
	return writeNew(dir, map[string][]byte{
		GatewayConfigFile:   []byte(conf),
		GatewayPasswordFile: append(append([]byte{}, g.Password...), '\n'),
	})
}
