package network

import "slices"

// Status is the overview /debug/networkz serves.
type Status struct {
	Generation   uint64 `json:"generation"`
	MultiNetwork bool   `json:"multi_network"`
	ScaleFactor  uint32 `json:"scale_factor"`
	// Precedence lists the rules that decide an endpoint's network, first
	// match wins. The endpoint pipeline, which applies them, fills it in.
	Precedence []string        `json:"precedence"`
	Networks   []NetworkStatus `json:"networks"`
	Gateways   []Gateway       `json:"gateways"`
	// Pending are networks whose configured gateways have no address yet.
	Pending    map[string]string `json:"pending,omitempty"`
	DNSServers []string          `json:"dns_servers"`
	DNS        []DNSStatus       `json:"dns"`
	Notes      []string          `json:"notes,omitempty"`
	File       string            `json:"meshnetworks_file,omitempty"`
}

// NetworkStatus is one configured network.
type NetworkStatus struct {
	Name      string   `json:"name"`
	Declared  string   `json:"declared_at"`
	Endpoints []string `json:"endpoints"`
	Gateways  []string `json:"gateways"`
}

// Status reports networks, gateways and DNS names.
func (m *Manager) Status() Status {
	s := m.snap.Load()
	st := Status{
		Generation: s.gen, MultiNetwork: s.multi, ScaleFactor: s.scale,
		Networks: []NetworkStatus{}, Gateways: slices.Clone(s.gateways), Pending: s.pending,
		DNS: m.res.status(), Notes: s.notes, File: s.cfg.File,
	}
	if st.Gateways == nil {
		st.Gateways = []Gateway{}
	}
	m.res.mu.Lock()
	st.DNSServers = slices.Clone(m.res.servers)
	m.res.mu.Unlock()
	for _, n := range s.cfg.Networks {
		ns := NetworkStatus{Name: n.Name, Declared: position(n.Range), Endpoints: []string{}, Gateways: []string{}}
		for _, r := range n.Endpoints {
			ns.Endpoints = append(ns.Endpoints, r.String())
		}
		for _, g := range n.Gateways {
			ns.Gateways = append(ns.Gateways, g.String())
		}
		st.Networks = append(st.Networks, ns)
	}
	return st
}
