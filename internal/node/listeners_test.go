package node

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/natstest"
)

// selfSigned writes a certificate for 127.0.0.1 and its key into dir and
// returns their paths and a pool trusting the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hedgerow-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	return certFile, keyFile, roots
}

// TestGatewayServesTLSAndMovesOperationsToTheInternalListener: with
// http.tls the API listener speaks TLS only; with http.internal_listen
// /readyz and /metrics leave it for the internal listener.
func TestGatewayServesTLSAndMovesOperationsToTheInternalListener(t *testing.T) {
	cfg := parse(t, "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", "")
	certFile, keyFile, roots := selfSigned(t, t.TempDir())
	cfg.HTTP.TLS.CertFile, cfg.HTTP.TLS.KeyFile = certFile, keyFile
	cfg.HTTP.InternalListen = "127.0.0.1:0"
	nc := natstest.Connect(t, natstest.Start(t, natstest.MaxPayload(16<<20)), nats.Name("gateway"))
	g, err := StartGateway(cfg, nc, nil, Options{})
	if err != nil {
		t.Fatalf("StartGateway: %v", err)
	}
	defer stop(t, g)
	tlsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer tlsClient.CloseIdleConnections()
	fetch := func(c *http.Client, url string) (int, string) {
		t.Helper()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	api, internal := "https://"+g.Addr().String(), "http://"+g.InternalAddr().String()
	tests := []struct {
		name     string
		client   *http.Client
		url      string
		status   int
		contains string
	}{
		{"the API answers over TLS", tlsClient, api + "/v1/models", http.StatusOK, `"general"`},
		{"the API no longer serves metrics", tlsClient, api + "/metrics", http.StatusNotFound, "unknown_url"},
		{"the API no longer serves readiness", tlsClient, api + "/readyz", http.StatusNotFound, "unknown_url"},
		{"the API still serves liveness", tlsClient, api + "/healthz", http.StatusOK, ""},
		{"the internal listener serves metrics", http.DefaultClient, internal + "/metrics", http.StatusOK, "go_goroutines"},
		{"the internal listener serves liveness", http.DefaultClient, internal + "/healthz", http.StatusOK, ""},
		{"the internal listener serves no API", http.DefaultClient, internal + "/v1/models", http.StatusNotFound, "unknown_url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := fetch(tt.client, tt.url)
			if status != tt.status || !strings.Contains(body, tt.contains) {
				t.Fatalf("GET %s: %d %.200s, want %d with %q", tt.url, status, body, tt.status, tt.contains)
			}
		})
	}
	// Plain HTTP on the TLS listener gets no answer of the API.
	if resp, err := http.Get("http://" + g.Addr().String() + "/v1/models"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("plain HTTP on the TLS listener answered 200: %.200s", b)
		}
	}
}
