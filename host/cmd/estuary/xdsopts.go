package main

import (
	"fmt"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/xds"
)

// xdsOptions turns the xds block into the server's options (all but Ready).
func xdsOptions(x config.XDS) xds.Options {
	o := xds.Options{Listen: x.Listen, DebounceAfter: x.DebounceAfter, DebounceMax: x.DebounceMax,
		MaxConnectionAge: x.MaxConnectionAge, DrainGrace: x.DrainGrace,
		Limits: xds.Limits{MaxViews: x.MaxViews, MaxConnections: x.MaxConnections, MaxStreamsPerConnection: x.MaxStreamsPerConnection,
			MaxResourceNames: x.MaxResourceNames, MaxUnknownTypes: x.MaxUnknownTypes},
	}
	if x.MaxUnknownTypes == 0 {
		o.Limits.MaxUnknownTypes = -1 // max_unknown_types = 0: refuse every unknown type
	}
	if x.TLS != nil {
		o.TLS = &xds.TLSFiles{CertFile: x.TLS.CertFile, KeyFile: x.TLS.KeyFile, ClientCAFile: x.TLS.ClientCAFile}
	}
	if a := x.Authorize; a != nil {
		o.Policy = &xds.Policy{Routers: a.Routers}
		if a.TrustDomains != nil {
			o.Policy.TrustDomains = map[string]xds.TrustDomainPolicy{}
			for td, c := range a.TrustDomains {
				o.Policy.TrustDomains[td] = xds.TrustDomainPolicy{Clusters: c.Clusters, Networks: c.Networks}
			}
		}
	}
	return o
}

// meshMTLS is the workload mTLS the clusters carry; config validated the
// mode, and an empty one (a File not from Load) is the default.
func meshMTLS(m config.Mesh) xds.MTLS {
	mode, err := xds.ParseMTLSMode(m.MTLS)
	if err != nil {
		mode = xds.MTLSPermissive
	}
	return xds.MTLS{Mode: mode, TrustDomain: m.TrustDomain}
}

// xdsWarnings are what the operator must know about the xds block: plain
// text beyond loopback, which insecure = true allowed. The host logs them
// at start-up and /readyz shows them.
func xdsWarnings(x config.XDS) []string {
	if !x.Exposed() {
		return nil
	}
	return []string{fmt.Sprintf("xDS serves plain text on %s, beyond loopback (xds insecure = true): anyone who can connect gets every service, endpoint and service account, and may claim any node", x.Listen)}
}
