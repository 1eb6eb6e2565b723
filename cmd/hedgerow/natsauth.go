package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/natsauth"
)

func newNATSAuthCmd() *cobra.Command {
	var (
		configPath, out, method string
		workers, clients        []string
		tlsOn, serve            bool
		tlsNames                []string
		gwName, gwListen        string
		gwAdvertise, from       string
		gwRemotes               []string
	)
	cmd := &cobra.Command{
		Use:   "nats-auth --config FILE --out DIR",
		Short: "Write NATS users with least-privilege permissions for every hedgerow role",
		Long: `nats-auth writes DIR/nats-server.conf, an authorization block with one NATS user per
role and the subjects that role needs (docs/architecture.md §13), and each user's
secret in a file of its own (mode 0600): an nkey seed DIR/<user>.nk, or with
--method password a random password DIR/<user>.password (the server keeps its
bcrypt hash). Users: gateway, one worker user per --worker NAME=ROUTE,ROUTE
(default: "worker", every route; it may take its routes' attempts only in their
queue groups), one client per --client NAME (default: "client"; it may only
request hedgerow.submit and must connect with the inbox prefix printed for it),
observer (reads the records only) and, with --serve only, serve (gateway and
workers of every route in one process: hedgerow serve with nats.listen). Route
names and the workers' reply bound (the longest policy deadline) come from
--config.

With --tls it also writes a CA, the servers' certificate (for 127.0.0.1,
localhost and each --tls-name) and a client certificate per user into DIR/tls
(ECDSA P-256), and the server configuration then requires TLS with a client
certificate the CA signed; each process sets nats.tls {ca_file, cert_file,
key_file} to its user's files.

Give DIR/nats-server.conf to serve as nats.server_config (or include it in your
nats-server's configuration) and each process its user's secret. Existing files
are never overwritten.

Regions (docs/architecture.md §13, "Gateway links"): with --gateway-listen it
also writes DIR/nats-server-gateway.conf, the gateway block that joins the
region's cluster (--gateway-name, default deployment.region) to the others
(--gateway-remote NAME=HOST:PORT[,HOST:PORT], repeatable) over TLS with the
deployment's CA (verify: true) and a link user, gateway-link, whose password
every region shares (DIR/gateway-link.password; the block holds it too, so it
is a secret, 0600). Include it from the region's nats-server configuration.
Generate the first region without --from (a new CA, whose key stays in
DIR/tls/ca-key.pem, and a new link password); every other region with --from
FIRST_DIR, whose CA signs its certificates and whose password it takes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.LoadForNATSUsers(configPath)
			var problems config.Problems
			if errors.As(err, &problems) {
				for _, p := range problems {
					if _, werr := fmt.Fprintln(cmd.ErrOrStderr(), p); werr != nil {
						return werr
					}
				}
				return invalidConfigError{file: configPath, problems: problems}
			}
			if err != nil {
				return err
			}
			spec := natsauth.SpecForConfig(cfg)
			spec.Method, spec.Serve, spec.Clients, spec.Workers = natsauth.Method(method), serve, clients, map[string][]string{}
			for _, w := range workers {
				name, routes, ok := strings.Cut(w, "=")
				if !ok || name == "" || routes == "" {
					return fmt.Errorf("--worker %q: want NAME=ROUTE[,ROUTE...]", w)
				}
				spec.Workers[name] = strings.Split(routes, ",")
			}
			if tlsOn {
				spec.TLS = &natsauth.TLSSpec{ServerNames: tlsNames}
			} else if len(tlsNames) > 0 {
				return errors.New("--tls-name needs --tls")
			}
			if err := gatewayFlags(&spec, gwName, gwListen, gwAdvertise, from, gwRemotes); err != nil {
				return err
			}
			b, err := natsauth.Generate(spec)
			if err != nil {
				return err
			}
			if err := b.Write(out); err != nil {
				return err
			}
			// A directory that existed keeps its mode otherwise.
			if err := os.Chmod(out, 0o700); err != nil {
				return err
			}
			return printNATSAuth(cmd, b, out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configPath, "config", "", "configuration file whose routes and policies the permissions follow (required)")
	f.StringVar(&out, "out", "", "directory to write the server configuration and the secrets into (required)")
	f.StringVar(&method, "method", string(natsauth.MethodNKey), "how users authenticate: nkey or password")
	f.StringArrayVar(&workers, "worker", nil, "a worker user and its routes, NAME=ROUTE,ROUTE (repeatable; default: worker=every route)")
	f.StringArrayVar(&clients, "client", nil, "a client user (repeatable; default: client)")
	f.BoolVar(&serve, "serve", false, "also write the serve user, for hedgerow serve with nats.listen (gateway and workers of every route in one process)")
	f.BoolVar(&tlsOn, "tls", false, "also write a CA, the servers' certificate and a client certificate per user, and require TLS")
	f.StringArrayVar(&tlsNames, "tls-name", nil, "a host name or IP address the servers' certificate answers to besides 127.0.0.1 and localhost (repeatable; with --tls)")
	f.StringVar(&gwListen, "gateway-listen", "", "HOST:PORT this region's servers take gateway links on: also write the gateway block (needs --tls)")
	f.StringVar(&gwName, "gateway-name", "", "this region's cluster name in the supercluster (default: deployment.region)")
	f.StringVar(&gwAdvertise, "gateway-advertise", "", "HOST:PORT the other regions dial instead of --gateway-listen (a proxy, a public address)")
	f.StringArrayVar(&gwRemotes, "gateway-remote", nil, "another region's gateways, NAME=HOST:PORT[,HOST:PORT] (repeatable)")
	f.StringVar(&from, "from", "", "the first region's nats-auth directory: its CA signs this region's certificates and its gateway-link password is this region's")
	_ = cmd.MarkFlagRequired("config")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

// gatewayFlags adds the gateway block the flags ask for to spec: none
// without --gateway-listen, which the other gateway flags need.
func gatewayFlags(spec *natsauth.Spec, name, listen, advertise, from string, remotes []string) error {
	if listen == "" {
		if name != "" || advertise != "" || from != "" || len(remotes) > 0 {
			return errors.New("--gateway-name, --gateway-advertise, --gateway-remote and --from need --gateway-listen")
		}
		return nil
	}
	if spec.TLS == nil {
		return errors.New("--gateway-listen needs --tls: gateway links use the deployment's certificates")
	}
	if name == "" && spec.Region == "" {
		return errors.New("--gateway-listen needs a region: deployment.region in the file, or --gateway-name")
	}
	g := &natsauth.GatewaySpec{Name: name, Listen: listen, Advertise: advertise}
	for _, r := range remotes {
		n, urls, ok := strings.Cut(r, "=")
		if !ok || n == "" || urls == "" {
			return fmt.Errorf("--gateway-remote %q: want NAME=HOST:PORT[,HOST:PORT]", r)
		}
		g.Remotes = append(g.Remotes, natsauth.GatewayRemote{Name: n, URLs: strings.Split(urls, ",")})
	}
	if from != "" {
		ca, err := natsauth.ReadCA(from)
		if err != nil {
			return err
		}
		if g.Password, err = natsauth.ReadGatewayPassword(from); err != nil {
			return err
		}
		spec.TLS.CA = ca
	}
	spec.Gateway = g
	return nil
}

// printNATSAuth tells the operator what each process sets.
func printNATSAuth(cmd *cobra.Command, b *natsauth.Bundle, out string) error {
	w := cmd.OutOrStdout()
	abs := func(name string) string {
		p, err := filepath.Abs(filepath.Join(out, name))
		if err != nil {
			return filepath.Join(out, name)
		}
		return p
	}
	var s strings.Builder
	fmt.Fprintf(&s, "wrote %s and one secret file per user (mode 0600)\n", abs(natsauth.ServerConfigFile))
	if b.Gateway != nil {
		fmt.Fprintf(&s, "wrote %s, the gateway links of %s (a secret: it holds the link password); include it from the region's nats-server configuration\n",
			abs(natsauth.GatewayConfigFile), b.Gateway.Spec.Name)
	}
	s.WriteString("\n")
	for _, u := range b.Users {
		fmt.Fprintf(&s, "%s (%s", u.Name, u.Role)
		if len(u.Routes) > 0 {
			fmt.Fprintf(&s, " of %s", strings.Join(u.Routes, ", "))
		}
		s.WriteString("):\n")
		switch {
		case u.Name == natsauth.UserServe:
			fmt.Fprintf(&s, "  nats: {server_config: %s, ", abs(natsauth.ServerConfigFile))
		case u.Role == "gateway" || u.Role == "worker":
			s.WriteString("  nats: {urls: [...], ")
		default:
			fmt.Fprintf(&s, "  connect with ")
		}
		if b.Method == natsauth.MethodNKey {
			fmt.Fprintf(&s, "nkey_seed_file: %s", abs(u.SecretFile))
		} else {
			fmt.Fprintf(&s, "user: %s, password_env: <a variable holding the contents of %s>", u.Name, abs(u.SecretFile))
		}
		if b.TLS != nil {
			fmt.Fprintf(&s, ", tls: {ca_file: %s, cert_file: %s, key_file: %s}", abs(filepath.Join(natsauth.TLSDir, natsauth.CAFile)),
				abs(filepath.Join(natsauth.TLSDir, natsauth.ClientCertFile(u.Name))), abs(filepath.Join(natsauth.TLSDir, natsauth.ClientKeyFile(u.Name))))
		}
		if u.Role == "serve" || u.Role == "gateway" || u.Role == "worker" {
			s.WriteString("}\n")
		} else {
			s.WriteString("\n")
		}
		if u.Role == "client" {
			fmt.Fprintf(&s, "  and the inbox prefix %s (nats.CustomInboxPrefix; nats CLI --inbox-prefix)\n", u.InboxPrefix)
		}
	}
	_, err := fmt.Fprint(w, s.String())
	if err == nil {
		_, err = fmt.Fprintln(cmd.ErrOrStderr(), "keep the secret files private:", abs(""))
	}
	return err
}
