package state

import (
	"errors"
	"fmt"
	"strings"
)

// RecordOperations keeps several operations' receipts in one log entry
// (the leader's receipt records, group-committed: coordinator/ops). Each
// record is applied exactly as a RecordOperation of its own would be, in
// order; a record that is refused (an invalid receipt, a key another
// operation holds) changes nothing and does not stop the others. The
// result's Err is then a *RecordErrors naming each refused record.
type RecordOperations struct {
	Records []RecordOperation `json:"records"`
}

// MaxRecordBatch bounds the records of one RecordOperations.
const MaxRecordBatch = 512

func (RecordOperations) commandType() string { return "audit.record_batch" }

// RecordErrors are the refusals of some records of a RecordOperations, by
// their position in Records; the other records were applied.
type RecordErrors struct {
	Errs []error // len(Records); nil where the record was applied
}

func (e *RecordErrors) Error() string {
	var parts []string
	for i, err := range e.Errs {
		if err != nil {
			parts = append(parts, fmt.Sprintf("record %d: %v", i, err))
		}
	}
	return "some receipt records were refused: " + strings.Join(parts, "; ")
}

// Unwrap gives the refusals, so errors.Is finds ErrExists or ErrInvalid
// in any of them.
func (e *RecordErrors) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// ItemErr is the refusal of record i of a RecordOperations whose result
// error is err (nil when it was applied or err is not a *RecordErrors
// covering it: then err itself, which refused the whole entry).
func ItemErr(err error, i int) error {
	var re *RecordErrors
	if errors.As(err, &re) {
		if i < len(re.Errs) {
			return re.Errs[i]
		}
		return nil
	}
	return err
}

func decodeAuditBatch(env envelope) (Command, bool, error) {
	if env.Type != "audit.record_batch" {
		return nil, false, nil
	}
	c, err := decodeAs[RecordOperations](env.Payload)
	return c, true, err
}

// applyAuditBatch applies a RecordOperations; ok is false for any other
// command.
func (s *State) applyAuditBatch(index uint64, c Command) (Result, bool) {
	b, ok := c.(RecordOperations)
	if !ok {
		return Result{}, false
	}
	if len(b.Records) == 0 || len(b.Records) > MaxRecordBatch {
		return Result{Err: invalid("a receipt batch holds 1 to %d records, not %d", MaxRecordBatch, len(b.Records))}, true
	}
	errs := make([]error, len(b.Records))
	failed := false
	for i, r := range b.Records {
		res, fatal := s.applyCore(index, r)
		if fatal != nil {
			// Not reachable for a RecordOperation; refuse the record
			// rather than stop the replica on a batch.
			res.Err = fatal
		}
		if res.Err != nil {
			errs[i], failed = res.Err, true
		}
	}
	if failed {
		return Result{Err: &RecordErrors{Errs: errs}}, true
	}
	return Result{}, true
}
