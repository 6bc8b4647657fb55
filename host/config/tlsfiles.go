package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/hashicorp/hcl/v2"
)

// tlsFiles names the files of a server tls block (xds or admin) and where
// each is written, so one check reports a bad file at its attribute.
type tlsFiles struct {
	block                      string // "xds" or "admin", for the summaries
	cert, key, clientCA        string
	certRng, keyRng, clientRng hcl.Range
}

// check reads the files and reports any that cannot be read or parsed: an
// unreadable file at its own attribute, a key pair that does not match at
// cert_file, and a client CA file without a PEM certificate at
// client_ca_file. It never quotes a file's content.
func (f tlsFiles) check() hcl.Diagnostics {
	var diags hcl.Diagnostics
	read := func(path string, rng hcl.Range) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Cannot read " + f.block + " tls file",
				Detail: err.Error() + ".", Subject: rng.Ptr()})
		}
		return b
	}
	cert, key := read(f.cert, f.certRng), read(f.key, f.keyRng)
	if cert != nil && key != nil {
		if _, err := tls.X509KeyPair(cert, key); err != nil {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid " + f.block + " tls certificate or key",
				Detail: fmt.Sprintf("%s and %s: %v.", f.cert, f.key, err), Subject: f.certRng.Ptr()})
		}
	}
	if f.clientCA != "" {
		if ca := read(f.clientCA, f.clientRng); ca != nil && !x509.NewCertPool().AppendCertsFromPEM(ca) {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid " + f.block + " client_ca_file",
				Detail: fmt.Sprintf("%s holds no PEM certificate.", f.clientCA), Subject: f.clientRng.Ptr()})
		}
	}
	return diags
}
