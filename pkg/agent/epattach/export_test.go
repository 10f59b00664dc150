package epattach

import "github.com/cilium/statedb"

// ReadTxn is a read transaction of the table's database, for the tests.
func (t *Table) ReadTxn() statedb.ReadTxn { return t.db.ReadTxn() }
