package config

import (
	"fmt"
	"net"

	"github.com/hashicorp/hcl/v2"

	"github.com/estuary-mesh/estuary/host/model"
)

// decodeXDSSecurity applies the xds block's TLS, authorization and limit
// attributes, which xdsBlock decoded, and checks them together with the
// listen address.
func decodeXDSSecurity(b *hcl.Block, xb *xdsBlock, x *XDS) hcl.Diagnostics {
	var diags hcl.Diagnostics
	for _, l := range []struct {
		name string
		src  *int
		dst  *int
	}{
		{"max_views", xb.MaxViews, &x.MaxViews},
		{"max_connections", xb.MaxConns, &x.MaxConnections},
		{"max_streams_per_connection", xb.MaxStreams, &x.MaxStreamsPerConnection},
		{"max_resource_names", xb.MaxNames, &x.MaxResourceNames},
		{"max_unknown_types", xb.MaxUnknown, &x.MaxUnknownTypes},
	} {
		if l.src == nil {
			continue
		}
		// max_unknown_types may be 0: every unknown type is refused.
		if *l.src < 0 || (*l.src == 0 && l.name != "max_unknown_types") {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid " + l.name,
				Detail: fmt.Sprintf("%s must be a positive number, not %d.", l.name, *l.src), Subject: attrRange(b.Body, l.name).Ptr()})
			continue
		}
		*l.dst = *l.src
	}
	if xb.Insecure != nil {
		x.Insecure = *xb.Insecure
	}
	if t := xb.TLS; t != nil {
		x.TLS = &XDSTLS{CertFile: t.CertFile, KeyFile: t.KeyFile,
			CertRange: attrRange(t.Body, "cert_file"), KeyRange: attrRange(t.Body, "key_file")}
		if t.ClientCAFile != nil {
			x.TLS.ClientCAFile = *t.ClientCAFile
			x.TLS.ClientCARange = attrRange(t.Body, "client_ca_file")
		}
	}
	if a := xb.Authorize; a != nil {
		x.Authorize = &XDSAuthorize{Routers: a.Routers}
		for i, id := range a.Routers {
			if _, err := model.ParseSPIFFEID(id); err != nil {
				diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid router identity",
					Detail: fmt.Sprintf("routers[%d]: %v.", i, err), Subject: attrRange(a.Body, "routers").Ptr()})
			}
		}
		for _, td := range a.TrustDomains {
			if x.Authorize.TrustDomains == nil {
				x.Authorize.TrustDomains = map[string]TrustDomainClaims{}
			}
			if _, dup := x.Authorize.TrustDomains[td.Name]; dup {
				diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Duplicate trust_domain block",
					Detail: fmt.Sprintf("Trust domain %q is already declared.", td.Name), Subject: td.DefRange.Ptr()})
				continue
			}
			x.Authorize.TrustDomains[td.Name] = TrustDomainClaims{Clusters: td.Clusters, Networks: td.Networks}
		}
		if x.TLS == nil || x.TLS.ClientCAFile == "" {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "authorize needs client certificates",
				Detail:  "The authorize block checks nodes against the SPIFFE ID of their client certificate; set tls { client_ca_file = \"...\" } so clients present one.",
				Subject: a.DefRange.Ptr()})
		}
	}
	_, _, badListen := net.SplitHostPort(x.Listen) // reported by checkListen
	if x.TLS == nil && !x.Insecure && !loopback(x.Listen) && badListen == nil {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "xDS beyond loopback needs tls",
			Detail: fmt.Sprintf("listen %q is reachable from other hosts, and plain-text xDS gives every service, endpoint and service account to anyone who connects. "+
				"Add tls { cert_file, key_file, client_ca_file }, or write insecure = true to accept that.", x.Listen),
			Subject: attrRange(b.Body, "listen").Ptr()})
	}
	return diags
}

// loopback reports whether a listen address (xds or admin) is reachable
// only from this host. An empty host or 0.0.0.0 is every interface.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Exposed reports whether xDS is served in plain text beyond loopback,
// which only insecure = true allows.
func (x *XDS) Exposed() bool { return x.TLS == nil && !loopback(x.Listen) }

// CheckXDSTLSFiles reads the xds tls files and reports, at the attribute
// that names it, any that cannot be read or parsed. It is apart from
// Parse, as `estuary validate` on another machine may lack the files.
func CheckXDSTLSFiles(x *XDS) hcl.Diagnostics {
	if x.TLS == nil {
		return nil
	}
	t := x.TLS
	return tlsFiles{block: "xds", cert: t.CertFile, key: t.KeyFile, clientCA: t.ClientCAFile,
		certRng: t.CertRange, keyRng: t.KeyRange, clientRng: t.ClientCARange}.check()
}
