package l2announcer

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/tendril-net/tendril/pkg/loadbalancer"
)

// TableName is the announcements table.
const TableName = "l2-announcements"

// Announcement is an address this node answers ARP for on one device: it
// holds the lease of the service the address belongs to. Immutable once
// in the table.
type Announcement struct {
	Addr    netip.Addr
	Device  string
	IfIndex int
	// MAC is the device's: the answers' sender.
	MAC     net.HardwareAddr
	Service loadbalancer.ServiceName
	Status  reconciler.Status
}

// AnnouncementKey is the table's primary key.
type AnnouncementKey struct {
	Addr    netip.Addr
	IfIndex int
}

func (k AnnouncementKey) String() string { return k.Addr.String() + "@" + strconv.Itoa(k.IfIndex) }

// Key is the object's primary key.
func (a *Announcement) Key() AnnouncementKey {
	return AnnouncementKey{Addr: a.Addr, IfIndex: a.IfIndex}
}

func (a *Announcement) clone() *Announcement { c := *a; return &c }

func (a *Announcement) getStatus() reconciler.Status { return a.Status }

func (a *Announcement) setStatus(s reconciler.Status) *Announcement { a.Status = s; return a }

// same reports whether b asks the kernel for what a does.
func (a *Announcement) same(b *Announcement) bool {
	return a.Key() == b.Key() && a.Device == b.Device && a.MAC.String() == b.MAC.String() && a.Service == b.Service
}

// TableHeader and TableRow print the table (`tendril statedb dump`).
func (a *Announcement) TableHeader() []string {
	return []string{"Address", "Device", "MAC", "Service", "Status"}
}

func (a *Announcement) TableRow() []string {
	return []string{a.Addr.String(), fmt.Sprintf("%s (%d)", a.Device, a.IfIndex), a.MAC.String(), a.Service.String(), a.Status.String()}
}

var (
	announcementByKey = statedb.Index[*Announcement, AnnouncementKey]{
		Name:       "address",
		FromObject: func(a *Announcement) index.KeySet { return index.NewKeySet(index.String(a.Key().String())) },
		FromKey:    func(k AnnouncementKey) index.Key { return index.String(k.String()) },
		Unique:     true,
	}
	announcementByService = statedb.Index[*Announcement, loadbalancer.ServiceName]{
		Name:       "service",
		FromObject: func(a *Announcement) index.KeySet { return index.NewKeySet(index.String(a.Service.String())) },
		FromKey:    func(n loadbalancer.ServiceName) index.Key { return index.String(n.String()) },
	}
)

// NewTable registers the announcements table in db.
func NewTable(db *statedb.DB) (statedb.RWTable[*Announcement], error) {
	t, err := statedb.NewTable(db, TableName, announcementByKey, announcementByService)
	if err != nil {
		return nil, fmt.Errorf("%s table: %w", TableName, err)
	}
	return t, nil
}
