package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/estuary-mesh/estuary/testbed/certs"
)

// TestCLIPresentsAdminCredentials: against an admin server that asks for
// a token or a client certificate, proxy-config and explain are refused
// without either, and reach the page with the token file or the client
// certificate.
func TestCLIPresentsAdminCredentials(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "admin-ca")
	serverCert, serverKey := ca.Server(t, "admin").Write(t, dir, "server")
	clientCert, clientKey := ca.Client(t).Write(t, dir, "client")
	caFile, tokenFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "token")
	certs.WriteFile(t, caFile, ca.PEM)
	certs.WriteFile(t, tokenFile, []byte("cli-admin-token\n"))
	wrongToken := filepath.Join(dir, "wrong")
	certs.WriteFile(t, wrongToken, []byte("not-the-token\n"))

	var adminAddr string
	h := launchHost(t, func(xds, admin string) string {
		adminAddr = admin
		return fmt.Sprintf("xds {\n  listen = %q\n}\nadmin {\n  listen = %q\n  token_file = %q\n  tls {\n    cert_file = %q\n    key_file = %q\n    client_ca_file = %q\n  }\n}\n%s",
			xds, admin, tokenFile, serverCert, serverKey, caFile, staticBlock("static", "a.example.com"))
	})
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	probe := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: 5 * time.Second}
	h.eventually("admin serves HTTPS", 30*time.Second, func() bool {
		resp, err := probe.Get("https://" + adminAddr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	authenticated := "no connected node" // the page's own answer
	tests := []struct {
		name  string
		flags []string
		want  string
	}{
		{"no credentials over plain HTTP", nil, "400 Bad Request"},
		{"server CA only", []string{"--admin-ca-file", caFile}, "401 Unauthorized"},
		{"wrong token", []string{"--admin-ca-file", caFile, "--admin-token-file", wrongToken}, "401 Unauthorized"},
		{"token", []string{"--admin-ca-file", caFile, "--admin-token-file", tokenFile}, authenticated},
		{"client certificate", []string{"--admin-ca-file", caFile, "--admin-cert-file", clientCert, "--admin-key-file", clientKey}, authenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, cmd := range [][]string{
				{"proxy-config", "endpoints", "--node", "nobody"},
				{"explain", "endpoint", "--node", "nobody", "--cluster", "outbound|80||a.example.com"},
			} {
				args := append(append(cmd, "--admin", adminAddr), tt.flags...)
				out, _ := exec.Command(estuaryBin, args...).CombinedOutput()
				if !strings.Contains(string(out), tt.want) {
					t.Errorf("estuary %s: %s\nwant %q", strings.Join(args, " "), out, tt.want)
				}
			}
		})
	}
}
