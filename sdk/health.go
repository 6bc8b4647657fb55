package sdk

import "fmt"

// NoticeList bounds the notices a plugin reports: a source with thousands
// of broken objects must not make every health event (and every
// /debug/syncz page) carry all of them. It keeps the first Max notices
// added and counts the rest; List ends with one more notice saying how
// many were left out. Sort before adding, so the same notices are kept
// every time.
type NoticeList struct {
	// Max is how many notices are kept; 0 keeps none and only counts.
	Max int
	// Subject is the subject of the closing "and N more" notice, e.g.
	// "service web" or "datacenter dc1".
	Subject string

	items   []Notice
	dropped int
}

// Add appends n, or counts it once Max notices are kept.
func (l *NoticeList) Add(n ...Notice) {
	for _, x := range n {
		if len(l.items) < l.Max {
			l.items = append(l.items, x)
		} else {
			l.dropped++
		}
	}
}

// Len is the number of notices added, kept or not.
func (l *NoticeList) Len() int { return len(l.items) + l.dropped }

// List returns the kept notices, followed by an "and N more not shown"
// notice when some were dropped. It returns nil when nothing was added.
func (l *NoticeList) List() []Notice {
	if l.dropped == 0 {
		return l.items
	}
	return append(l.items[:len(l.items):len(l.items)],
		Notice{Subject: l.Subject, Message: fmt.Sprintf("and %d more not shown", l.dropped)})
}
