package config_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/estuary-mesh/estuary/testbed/certs"
)

// TestAdminSecurity: an admin server beyond loopback must authenticate,
// with a bearer token or client certificates, or say insecure = true,
// which is then a warning; each refusal points at its attribute.
func TestAdminSecurity(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	certs.WriteFile(t, token, []byte("s3cr3t-admin-token\n"))
	empty := filepath.Join(dir, "empty")
	certs.WriteFile(t, empty, []byte(" \n"))
	ca := certs.NewCA(t, "admin-ca")
	cert, key := ca.Server(t, "admin").Write(t, dir, "server")
	caFile := filepath.Join(dir, "ca.pem")
	certs.WriteFile(t, caFile, ca.PEM)
	tlsBlock := func(clientCA string) string {
		s := fmt.Sprintf("\n  tls {\n    cert_file = %q\n    key_file = %q\n", cert, key)
		if clientCA != "" {
			s += fmt.Sprintf("    client_ca_file = %q\n", clientCA)
		}
		return s + "  }"
	}
	tests := []struct {
		name, body string
		want       string // diagnostics, "" for none
	}{
		{"loopback without auth", `listen = "127.0.0.1:0"`, ""},
		{"localhost without auth", `listen = "localhost:0"`, ""},
		{"everywhere without auth", `listen = "0.0.0.0:15014"`,
			`plugins.hcl:2:12: error: Admin server beyond loopback needs authentication: listen "0.0.0.0:15014" is reachable from other hosts`},
		{"empty host without auth", `listen = ":15014"`,
			`plugins.hcl:2:12: error: Admin server beyond loopback needs authentication`},
		{"server TLS alone does not authenticate", `listen = "0.0.0.0:15014"` + tlsBlock(""),
			`plugins.hcl:2:12: error: Admin server beyond loopback needs authentication`},
		{"insecure", "listen = \"0.0.0.0:15014\"\n  insecure = true",
			`plugins.hcl:3:14: warning: Admin server beyond loopback without authentication: insecure = true: anyone who reaches 0.0.0.0:15014`},
		{"token", fmt.Sprintf("listen = \"0.0.0.0:15014\"\n  token_file = %q", token), ""},
		{"client certificates", `listen = "0.0.0.0:15014"` + tlsBlock(caFile), ""},
		{"missing token file", fmt.Sprintf("listen = \"0.0.0.0:15014\"\n  token_file = %q", filepath.Join(dir, "nope")),
			`plugins.hcl:3:16: error: Invalid admin token_file: open ` + filepath.Join(dir, "nope") + `: no such file or directory`},
		{"empty token file", fmt.Sprintf("token_file = %q", empty),
			`plugins.hcl:2:16: error: Invalid admin token_file: ` + empty + ` is empty`},
		{"bad client CA", `listen = "127.0.0.1:0"` + tlsBlock(token),
			`plugins.hcl:6:22: error: Invalid admin client_ca_file: ` + token + ` holds no PEM certificate`},
		{"bad certificate", fmt.Sprintf("tls {\n    cert_file = %q\n    key_file = %q\n  }", caFile, key),
			`plugins.hcl:3:17: error: Invalid admin tls certificate or key`},
		{"max_connections", "max_connections = 0", `plugins.hcl:2:21: error: Invalid max_connections: max_connections must be at least 1, not 0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, got := parse(t, "admin {\n  "+tt.body+"\n}\n")
			if tt.want == "" && got != "" || tt.want != "" && !strings.HasPrefix(got, tt.want) {
				t.Errorf("diagnostics:\n got: %s\nwant: %s", got, tt.want)
			}
			if strings.Contains(got, "s3cr3t") {
				t.Errorf("a diagnostic shows the token: %s", got)
			}
		})
	}
}
