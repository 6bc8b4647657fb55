package model

// Change tells readers what a batch of registry events changed. The
// replica publishes it; the aggregate, the network manager and the xDS
// server consume it.
type Change struct {
	// Full is set when instances or gateways changed: everything may differ.
	Full bool
	// Services maps each changed hostname to true when the service itself
	// (ports, addresses, attributes) changed, false when only its endpoints
	// did.
	Services map[string]bool
}

// Empty reports whether the change changes nothing.
func (c *Change) Empty() bool { return !c.Full && len(c.Services) == 0 }

// Merge folds o into c.
func (c *Change) Merge(o Change) {
	c.Full = c.Full || o.Full
	for h, svc := range o.Services {
		c.Touch(h, svc)
	}
}

// Touch records that hostname changed: its service attributes too when
// attrs is set, otherwise only its endpoints (unless already recorded as
// an attribute change).
func (c *Change) Touch(hostname string, attrs bool) {
	if c.Services == nil {
		c.Services = map[string]bool{}
	}
	c.Services[hostname] = c.Services[hostname] || attrs
}
