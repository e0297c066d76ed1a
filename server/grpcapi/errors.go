package grpcapi

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/grammar"
)

// errorCodes is the one table mapping errors to gRPC codes: the first row
// whose match reports true wins; anything else is Internal.
var errorCodes = []struct {
	match func(error) bool
	code  codes.Code
}{
	{isFieldError, codes.InvalidArgument},
	{is(engine.ErrTooLong), codes.InvalidArgument},
	{is(engine.ErrGrammarUnsupported), codes.InvalidArgument},
	{is(grammar.ErrGrammarTooComplex), codes.InvalidArgument},
	{is(engine.ErrQueueFull), codes.ResourceExhausted},
	{is(engine.ErrDraining), codes.Unavailable},
	{is(context.Canceled), codes.Canceled},
	{is(context.DeadlineExceeded), codes.DeadlineExceeded},
}

func is(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

func isFieldError(err error) bool {
	var fe *FieldError
	return errors.As(err, &fe)
}

// Code is the gRPC code err maps to (OK for nil).
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	for _, row := range errorCodes {
		if row.match(err) {
			return row.code
		}
	}
	return codes.Internal
}

// ToStatus turns err into a gRPC status error with the code of the table
// and err's text; a validation error also carries a BadRequest detail
// naming the field. Status errors pass unchanged; nil stays nil.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	st := status.New(Code(err), err.Error())
	var fe *FieldError
	if errors.As(err, &fe) {
		if d, derr := st.WithDetails(&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: fe.Field, Description: fe.Reason}},
		}); derr == nil {
			st = d
		}
	}
	return st.Err()
}
