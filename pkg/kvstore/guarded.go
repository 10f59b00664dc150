package kvstore

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The guarded writes below let two parties that must not act on a stale
// view of each other (an agent referencing an identity, the operator
// collecting it) order themselves through one etcd transaction each: the
// second of the two sees what the first did and does nothing.

// UpdateIfMissingWhileHolds is UpdateIfMissing conditioned on guard
// holding guardValue: it writes key (unless it already holds value on the
// asked lease) only while guard exists with exactly that value, in one
// transaction. guardHolds is false when guard was missing or held another
// value, and nothing was written. (A reference to an identity must name
// the identity's labels, not just its number: a number collected and
// taken by another label set must not be referenced for the old one.)
func (c *Client) UpdateIfMissingWhileHolds(ctx context.Context, key string, value []byte, lease LeaseMode, guard string, guardValue []byte) (wrote, guardHolds bool, err error) {
	opts, leaseID, err := c.leaseOption(ctx, lease)
	if err != nil {
		return false, false, fmt.Errorf("kvstore guarded update %q: %w", key, err)
	}
	inner := clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(key), "=", string(value)), clientv3.Compare(clientv3.LeaseValue(key), "=", leaseID)},
		nil,
		[]clientv3.Op{clientv3.OpPut(key, string(value), opts...)},
	)
	// A value comparison against a missing key fails: a missing guard
	// takes the Else branch too.
	resp, err := c.etcd.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(guard), "=", string(guardValue))).
		Then(inner).
		Commit()
	if err != nil {
		c.noteWriteError(err, leaseID)
		return false, false, fmt.Errorf("kvstore guarded update %q: %w", key, err)
	}
	if !resp.Succeeded {
		return false, false, nil
	}
	nested := resp.Responses[0].GetResponseTxn()
	return nested != nil && !nested.Succeeded, true, nil
}

// DeleteIfUnchangedAndEmpty deletes every key of revs in one transaction,
// only if each still has the mod revision given and no key exists under
// emptyPrefix. It reports whether it deleted.
func (c *Client) DeleteIfUnchangedAndEmpty(ctx context.Context, revs map[string]int64, emptyPrefix string) (bool, error) {
	if emptyPrefix == "" {
		return false, fmt.Errorf("kvstore guarded delete: empty prefix")
	}
	// Over an empty range etcd compares a zero key: version 0 matches.
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.Version(emptyPrefix), "=", 0).WithPrefix()}
	var ops []clientv3.Op
	for k, rev := range revs {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", rev))
		ops = append(ops, clientv3.OpDelete(k))
	}
	resp, err := c.etcd.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, fmt.Errorf("kvstore guarded delete under %q: %w", emptyPrefix, err)
	}
	return resp.Succeeded, nil
}
