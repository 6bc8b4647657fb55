package config

import (
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
)

// DefaultAdminMaxConnections bounds the admin server's connections: enough
// for probes, Prometheus and a few operators, few enough that a flood of
// idle connections cannot exhaust the host's descriptors.
const DefaultAdminMaxConnections = 64

// AdminTLS is the admin tls block.
type AdminTLS struct {
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
	// ClientCAFile, if set, is the CA a client certificate must chain to;
	// such a certificate authenticates a request as the token does.
	ClientCAFile string `json:"client_ca_file,omitempty"`
}

type adminTLSBlock struct {
	CertFile     string   `hcl:"cert_file"`
	KeyFile      string   `hcl:"key_file"`
	ClientCAFile *string  `hcl:"client_ca_file,optional"`
	Body         hcl.Body `hcl:",body"`
}

// decodeAdmin decodes the admin block. The token and TLS files are read
// here, so a missing or malformed one is reported at its attribute; an
// admin server beyond loopback that authenticates no one is an error
// unless insecure = true says so, and then a warning.
func decodeAdmin(b *hcl.Block, a *Admin) hcl.Diagnostics {
	var ab adminBlock
	diags := gohcl.DecodeBody(b.Body, nil, &ab)
	if diags.HasErrors() {
		return diags
	}
	listenRng := attrRange(b.Body, "listen")
	var badListen hcl.Diagnostics
	if ab.Listen != nil {
		a.Listen = *ab.Listen
		badListen = checkListen(*ab.Listen, listenRng)
		diags = append(diags, badListen...)
	}
	if ab.Insecure != nil {
		a.Insecure = *ab.Insecure
	}
	if ab.MaxConnections != nil {
		a.MaxConnections = *ab.MaxConnections
		if a.MaxConnections < 1 {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid max_connections",
				Detail: fmt.Sprintf("max_connections must be at least 1, not %d.", a.MaxConnections), Subject: attrRange(b.Body, "max_connections").Ptr()})
		}
	}
	if ab.TokenFile != nil {
		a.TokenFile = *ab.TokenFile
		if _, err := a.Token(); err != nil {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid admin token_file",
				Detail: err.Error() + ".", Subject: attrRange(b.Body, "token_file").Ptr()})
		}
	}
	if t := ab.TLS; t != nil {
		a.TLS = &AdminTLS{CertFile: t.CertFile, KeyFile: t.KeyFile}
		if t.ClientCAFile != nil {
			a.TLS.ClientCAFile = *t.ClientCAFile
		}
		diags = append(diags, tlsFiles{block: "admin", cert: t.CertFile, key: t.KeyFile, clientCA: a.TLS.ClientCAFile,
			certRng: attrRange(t.Body, "cert_file"), keyRng: attrRange(t.Body, "key_file"),
			clientRng: attrRange(t.Body, "client_ca_file")}.check()...)
	}
	if !badListen.HasErrors() && !loopback(a.Listen) && !a.Authenticates() {
		if !a.Insecure {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Admin server beyond loopback needs authentication",
				Detail: fmt.Sprintf("listen %q is reachable from other hosts, and the admin server shows the whole mesh and the host's configuration. "+
					"Set token_file (a bearer token), or tls { cert_file, key_file, client_ca_file } (client certificates), or write insecure = true to accept that.", a.Listen),
				Subject: listenRng.Ptr()})
		} else {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagWarning, Summary: "Admin server beyond loopback without authentication",
				Detail:  fmt.Sprintf("insecure = true: anyone who reaches %s reads the mesh and the host's configuration.", a.Listen),
				Subject: attrRange(b.Body, "insecure").Ptr()})
		}
	}
	return diags
}

// Authenticates reports whether the admin server checks who asks: a
// bearer token, or client certificates.
func (a *Admin) Authenticates() bool {
	return a.TokenFile != "" || (a.TLS != nil && a.TLS.ClientCAFile != "")
}

// Token reads the bearer token from TokenFile, without surrounding white
// space; an empty file is an error. It never returns the token in an
// error.
func (a *Admin) Token() (string, error) {
	b, err := os.ReadFile(a.TokenFile)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%s is empty", a.TokenFile)
	}
	return tok, nil
}

// ClientCAs reads ClientCAFile.
func (t *AdminTLS) ClientCAs() (*x509.CertPool, error) {
	b, err := os.ReadFile(t.ClientCAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", t.ClientCAFile)
	}
	return pool, nil
}
