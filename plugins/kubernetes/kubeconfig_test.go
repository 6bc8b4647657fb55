package kubernetes

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// kubeconfigYAML renders a one-cluster kubeconfig; user and cluster are the
// bodies of the user and cluster entries, indented by the caller.
func kubeconfigYAML(cluster, user string) string {
	return `apiVersion: v1
kind: Config
clusters:
- name: c2
  cluster:
` + cluster + `
contexts:
- name: c2
  context:
    cluster: c2
    user: u2
current-context: c2
users:
- name: u2
  user:
` + user + "\n"
}

const (
	okCluster = "    server: https://10.20.0.1:6443\n    certificate-authority-data: Y2E="
	okUser    = "    token: s3cr3t-token-value"
)

func TestKubeconfigPolicy(t *testing.T) {
	tests := []struct {
		name    string
		cluster string
		user    string
		allow   []string
		servers []string
		host    []string // the host's listen addresses
		wantErr []string // substrings; empty means accepted
	}{
		{name: "token and inline CA", cluster: okCluster, user: okUser},
		{name: "inline client certificate", cluster: okCluster, user: "    client-certificate-data: Y2VydA==\n    client-key-data: a2V5"},
		{
			name: "exec", cluster: okCluster,
			user:    "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [\"-c\", \"echo s3cr3t-arg\"]",
			wantErr: []string{`user "u2" uses "exec"`},
		},
		{
			name: "exec allowed", cluster: okCluster, allow: []string{"exec"},
			user: "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/true\n      interactiveMode: Never",
		},
		{
			name: "auth provider", cluster: okCluster,
			user:    "    auth-provider:\n      name: gcp\n      config:\n        cmd-path: /usr/bin/gcloud",
			wantErr: []string{`user "u2" uses auth-provider "gcp": no kubeconfig auth-provider is compiled into estuary`},
		},
		{
			name: "oidc is refused with the way out", cluster: okCluster,
			user:    "    auth-provider:\n      name: oidc\n      config:\n        idp-issuer-url: https://issuer.example.com\n        client-id: estuary\n        id-token: s3cr3t-id-token",
			wantErr: []string{`user "u2" uses auth-provider "oidc": no kubeconfig auth-provider is compiled into estuary`, "kubelogin", `allow_kubeconfig_options = ["exec"]`},
		},
		{
			name: "token file", cluster: okCluster, user: "    tokenFile: /var/run/secrets/token",
			wantErr: []string{`user "u2" uses "tokenFile"`},
		},
		{
			name: "client certificate and key files", cluster: okCluster, user: "    client-certificate: /etc/cert.pem\n    client-key: /etc/key.pem",
			wantErr: []string{`uses "client-certificate"`, `uses "client-key"`},
		},
		{
			name: "client certificate and key files allowed", cluster: "    server: https://10.20.0.1:6443",
			user:  "    client-certificate: /nonexistent/cert.pem\n    client-key: /nonexistent/key.pem",
			allow: []string{"client-certificate", "client-key"},
			// Allowed, so client-go reads the files, which do not exist.
			wantErr: []string{"/nonexistent/cert.pem"},
		},
		{
			name: "certificate authority file", cluster: "    server: https://10.20.0.1:6443\n    certificate-authority: /etc/ca.pem", user: okUser,
			wantErr: []string{`cluster "c2" uses "certificate-authority"`},
		},
		{name: "server in an allowed CIDR", cluster: okCluster, user: okUser, servers: []string{"10.20.0.0/16"}},
		{
			name: "server outside allowed_servers", cluster: "    server: https://admin:pw@198.51.100.1:443", user: okUser,
			servers: []string{"10.20.0.0/16", "*.example.com"},
			wantErr: []string{`cluster "c2": server https://198.51.100.1:443 is outside allowed_servers`},
		},
		{
			name: "server by host name", cluster: "    server: https://api.c2.example.com:6443", user: okUser,
			servers: []string{"10.20.0.0/16", "*.example.com"},
		},
		{
			name: "metadata address by default", cluster: "    server: https://admin:pw@169.254.169.254", user: okUser,
			wantErr: []string{`cluster "c2": server https://169.254.169.254 is refused: 169.254.169.254 is a link-local, metadata or unspecified address (169.254.0.0/16)`},
		},
		{
			name: "broad allowed_servers do not lift the default", cluster: "    server: https://169.254.169.254", user: okUser,
			servers: []string{"0.0.0.0/0"},
			wantErr: []string{"169.254.169.254 is a link-local, metadata or unspecified address"},
		},
		{
			name: "an allowed_servers entry inside link-local lifts it", cluster: "    server: https://169.254.10.5:6443", user: okUser,
			servers: []string{"169.254.10.5"},
		},
		{
			name: "IPv6 link-local", cluster: "    server: https://[fe80::1%25eth0]:6443", user: okUser,
			wantErr: []string{"fe80::1 is a link-local"},
		},
		{
			name: "AWS IPv6 metadata", cluster: "    server: https://[fd00:ec2::254]", user: okUser,
			wantErr: []string{"fd00:ec2::254 is a link-local, metadata"},
		},
		{
			name: "IPv4-mapped metadata", cluster: "    server: https://[::ffff:169.254.169.254]", user: okUser,
			wantErr: []string{"169.254.169.254 is a link-local"},
		},
		{
			name: "proxy at the metadata address", cluster: okCluster + "\n    proxy-url: http://169.254.169.254:80", user: okUser,
			wantErr: []string{`proxy-url http://169.254.169.254:80 is refused`},
		},
		{
			name: "the host's admin port", cluster: "    server: https://127.0.0.1:15014", user: okUser,
			host:    []string{"127.0.0.1:15010", "127.0.0.1:15014"},
			wantErr: []string{"server https://127.0.0.1:15014 is refused: 127.0.0.1:15014 is where estuary itself listens"},
		},
		{
			name: "the host's admin port by name", cluster: "    server: https://localhost:15014", user: okUser,
			host:    []string{"127.0.0.1:15014"},
			wantErr: []string{"127.0.0.1:15014 is where estuary itself listens"},
		},
		{
			name: "the host bound everywhere, by a machine address", cluster: "    server: https://192.0.2.44:15010", user: okUser,
			host:    []string{"0.0.0.0:15010", "[::]:15014"},
			wantErr: []string{"192.0.2.44:15010 is where estuary itself listens"},
		},
		{
			name: "the host bound everywhere, by loopback", cluster: "    server: http://127.0.0.1:15014", user: okUser,
			host:    []string{"0.0.0.0:15010", "[::]:15014"},
			wantErr: []string{"127.0.0.1:15014 is where estuary itself listens"},
		},
		{
			name: "another port of the host's address", cluster: "    server: https://127.0.0.1:6443", user: okUser,
			host: []string{"127.0.0.1:15014", "0.0.0.0:15010"},
		},
		{
			name: "proxy outside allowed_servers", cluster: okCluster + "\n    proxy-url: http://198.51.100.9:3128", user: okUser,
			servers: []string{"10.20.0.0/16"},
			wantErr: []string{`proxy-url http://198.51.100.9:3128 is outside allowed_servers`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := kubeconfigPolicy{allowed: map[string]bool{}, hostAddrs: tt.host,
				localAddrs: func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("192.0.2.44")} }}
			for _, a := range tt.allow {
				p.allowed[a] = true
			}
			if tt.servers != nil {
				s, errs := parseAllowedServers(tt.servers)
				if len(errs) > 0 {
					t.Fatalf("allowed servers: %v", errs)
				}
				p.servers = s
			}
			rc, err := p.restConfig([]byte(kubeconfigYAML(tt.cluster, tt.user)))
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				if rc.Host == "" {
					t.Errorf("no host in %+v", rc)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want an error with %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			for _, secret := range []string{"s3cr3t", "admin:pw", "/bin/sh", "gcloud"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q shows %q from the kubeconfig", err, secret)
				}
			}
			if !errors.Is(err, ErrKubeconfigRejected) {
				t.Errorf("error %v does not wrap ErrKubeconfigRejected", err)
			}
		})
	}
}

// TestKubeconfigDialChecksTheRealAddress: a host name that passes the
// check as written is checked again where the client connects, so a name
// that resolves to the metadata address or the host itself is refused.
func TestKubeconfigDialChecksTheRealAddress(t *testing.T) {
	p := kubeconfigPolicy{allowed: map[string]bool{}, hostAddrs: []string{"127.0.0.1:15014"}}
	rc, err := p.restConfig([]byte(kubeconfigYAML("    server: https://localhost:6443\n    certificate-authority-data: Y2E=", okUser)))
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"169.254.169.254:80", "127.0.0.1:15014"} {
		conn, err := rc.Dial(context.Background(), "tcp", addr)
		if err == nil {
			conn.Close()
		}
		if !errors.Is(err, ErrKubeconfigRejected) {
			t.Errorf("dial %s = %v, want it refused", addr, err)
		}
	}
}

func TestKubeconfigNotParsable(t *testing.T) {
	p := kubeconfigPolicy{allowed: map[string]bool{}}
	for _, data := range []string{"", "users: [", "apiVersion: v1\nkind: Config\n"} {
		if _, err := p.restConfig([]byte(data)); err == nil {
			t.Errorf("kubeconfig %q accepted", data)
		}
	}
}

func TestAllowedServers(t *testing.T) {
	a, errs := parseAllowedServers([]string{"10.0.0.0/8", "192.0.2.7", "fd00::/8", "API.Example.com", "*.corp.example", "not a host", "300.1.1.1/8"})
	if len(errs) != 2 || errs[5] == nil || errs[6] == nil {
		t.Fatalf("errors = %v, want entries 5 and 6 rejected", errs)
	}
	tests := []struct {
		host string
		want bool
	}{
		{"10.1.2.3", true},
		{"11.1.2.3", false},
		{"192.0.2.7", true},
		{"192.0.2.8", false},
		{"[fd00::1]", true},
		{"fd00::1", true},
		{"api.example.com", true},
		{"api.example.com.", true},
		{"evil-api.example.com", false},
		{"k8s.corp.example", true},
		{"a.b.corp.example", true},
		{"corp.example", false},
		{"localhost", false},
	}
	for _, tt := range tests {
		if got := a.allows(tt.host); got != tt.want {
			t.Errorf("allows(%q) = %v, want %v", tt.host, got, tt.want)
		}
	}
}
