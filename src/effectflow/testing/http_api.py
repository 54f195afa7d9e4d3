"""How each simulated provider's operations travel over HTTP, declared once per provider.

Each provider module ends with its table: a :class:`Table` subclass with one :func:`post` or
:func:`get` entry per operation, naming the provider's method, its route, and where each of the
method's parameters travels (the JSON body, the query string, a header, the path)::

    class MailApi(http_api.Table):
        KIND = MailProvider.KIND
        send = http_api.post(
            "/mail/send",
            MailProvider.send,
            body={"to": TEXT, "subject": TEXT, "body": TEXT, "metadata": TEXT_MAP},
            headers={"idempotency_key": "Idempotency-Key"},
            key="idempotency_key",
        )
        status = http_api.get(
            "/mail/status",
            MailProvider.status,
            query=("idempotency_key", "message_id"),
            answer=Answer.FOUND,
        )

From that one table the service (:mod:`effectflow.testing.service`) makes its routes and the
client (:mod:`effectflow.testing.http_clients`) its methods: ``class HttpMail(_HttpProvider,
MailApi)``, where each entry read on a client is a method with the provider method's own
signature. An entry that leaves one of the method's parameters unplaced, or places one twice, is
refused when the module is imported.

What both sides agree on:

- A value the request leaves out (or sends as ``null``) is the parameter's default where it has
  one. Without a default, a body field or query parameter must be there (400 ``invalid_request``,
  "``<name>`` is required") unless its :class:`Field` allows null; a header is then ``""``, which a
  provider refuses itself (an empty idempotency key).
- The client sends a body field even when it is None, and a query parameter or header only when it
  is not. A path parameter is quoted whole, slashes too, unless the template says ``{name:path}``
  (a deploy target such as ``deployment/prod`` keeps them); the service matches every path
  parameter as ``:path``, since the server sees the path decoded.
- Several entries may share one route and verb; each but the last is chosen by the presence of its
  ``selected_by`` query parameter, and a request that carries the query parameters of two of them
  is refused ("give at most one of ...").
- What comes back is the entry's :class:`Answer`.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import (
    Any,
    ClassVar,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)
from urllib.parse import quote

P = ParamSpec("P")
R = TypeVar("R")

#: A path parameter in a template: ``{name}`` (quoted whole) or ``{name:path}`` (slashes kept).
_PLACEHOLDER = re.compile(r"\{(\w+)(:path)?\}")


class BadRequest(Exception):
    """The request itself is malformed (not JSON, a field missing or of the wrong type)."""


# -- what a body field must hold -----------------------------------------------------------------


def _text(body: Mapping[str, Any], name: str) -> Any:
    value = body.get(name)
    if not isinstance(value, str):
        raise BadRequest(f"{name} is required and must be a string")
    return value


def _optional_text(body: Mapping[str, Any], name: str) -> Any:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"{name} must be a string or null")
    return value


def _optional_int(body: Mapping[str, Any], name: str) -> Any:
    value = body.get(name)
    if value is not None and type(value) is not int:
        raise BadRequest(f"{name} must be an integer or null")
    return value


def _text_map(body: Mapping[str, Any], name: str) -> Any:
    value = body.get(name)
    if value is not None and not (
        isinstance(value, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    ):
        raise BadRequest(f"{name} must be an object of strings")
    return value


def _as_sent(body: Mapping[str, Any], name: str) -> Any:
    if name not in body:
        raise BadRequest(f"{name} is required")
    return body[name]


@dataclasses.dataclass(frozen=True)
class Field:
    """What one JSON body field must hold; the service answers 400 ``invalid_request`` otherwise."""

    #: Reads the field from a request body: its value (None where absent or null and allowed), or
    #: :class:`BadRequest` naming the field.
    read: Callable[[Mapping[str, Any], str], Any]


#: A string, required.
TEXT = Field(_text)
#: A string or null.
OPTIONAL_TEXT = Field(_optional_text)
#: An integer (not a bool) or null.
OPTIONAL_INT = Field(_optional_int)
#: An object of strings, or null.
TEXT_MAP = Field(_text_map)
#: Anything, but present: the provider checks the value itself (a refund's amount is refused as
#: ``invalid_amount`` by the provider, over HTTP as in process).
AS_SENT = Field(_as_sent)


class Answer(enum.Enum):
    """How an operation's result travels back."""

    #: The result as JSON.
    RESULT = "result"
    #: The result as JSON, with an ``ETag`` header from its ``etag`` field (a deploy target).
    TAGGED = "tagged"
    #: The result as JSON, or 404 ``not_found`` for None (the client answers None again).
    FOUND = "found"
    #: A list, as ``{"data": [...]}``.
    LIST = "list"
    #: An object or None, as a list of one or none: ``{"data": [x]}`` or ``{"data": []}``.
    ZERO_OR_ONE = "zero_or_one"
    #: A number under the operation's name: ``{"overwrites": 3}``.
    COUNT = "count"
    #: Nothing: 204.
    NONE = "none"

    def encode(self, operation: str, value: Any) -> tuple[int, Any, dict[str, str]]:
        """The service's answer: ``(status, JSON or None for no body, headers)``."""
        if self is Answer.NONE:
            return 204, None, {}
        if self is Answer.FOUND and value is None:
            return 404, {"code": "not_found", "message": "no such object"}, {}
        if self is Answer.TAGGED:
            return 200, value, {"ETag": value["etag"]}
        if self is Answer.LIST:
            return 200, {"data": value}, {}
        if self is Answer.ZERO_OR_ONE:
            return 200, {"data": [] if value is None else [value]}, {}
        if self is Answer.COUNT:
            return 200, {operation: value}, {}
        return 200, value, {}

    def decode(self, operation: str, answer: Any) -> Any:
        """The client's result from the service's JSON (None for 204, or for a 404 lookup)."""
        if self is Answer.LIST:
            return [dict(item) for item in answer["data"]]
        if self is Answer.ZERO_OR_ONE:
            found = [dict(item) for item in answer["data"]]
            return found[0] if found else None
        if self is Answer.COUNT:
            return int(answer[operation])
        if self in (Answer.RESULT, Answer.TAGGED, Answer.FOUND) and answer is not None:
            return dict(answer)
        return answer


@dataclasses.dataclass(frozen=True)
class Request:
    """One call as the client sends it."""

    #: ``GET`` (a read) or ``POST`` (a call that may take effect).
    verb: Literal["GET", "POST"]
    #: The path, its parameters quoted.
    path: str
    #: The JSON body of a POST (``{}`` when the operation has no body fields); None for a GET.
    json: dict[str, Any] | None
    #: Query parameters that are not None.
    params: dict[str, str]
    #: Headers that are not None.
    headers: dict[str, str]
    #: The call's key (what a lost answer's ``ProviderTimeout`` names), if it has one.
    key: str | None


class Caller(Protocol):
    """What an entry needs from the object it is read on to be a method: a way to send a call."""

    def call_endpoint(self, endpoint: Endpoint[..., Any], request: Request) -> Any:
        """Send ``request`` and turn the answer into the operation's result or exception."""


class Endpoint(Generic[P, R]):
    """One operation of a provider's HTTP API (built by :func:`post` and :func:`get`).

    Read on a :class:`Caller` (a client), it is a method with the provider method's signature;
    read on its table, it is itself.
    """

    def __init__(
        self,
        verb: Literal["GET", "POST"],
        path: str,
        method: Callable[Concatenate[Any, P], R],
        *,
        body: Mapping[str, Field],
        query: Sequence[str],
        headers: Mapping[str, str],
        key: str | None,
        answer: Answer,
        selected_by: str | None,
    ) -> None:
        #: The verb: GET reads, POST may take effect.
        self.verb = verb
        #: The path template (``/deploy/{target:path}/deploy``).
        self.path = path
        #: The provider's method (called on the provider by the service).
        self.method = method
        #: The operation's name: the method's, also in errors and the call log.
        self.operation: str = method.__name__
        #: JSON body fields by parameter name, in the order the service checks them.
        self.body = dict(body)
        #: Query parameters (a ``**kwargs`` parameter named here takes the whole query string).
        self.query = tuple(query)
        #: Header name by parameter name.
        self.headers = dict(headers)
        #: The parameter whose value is the call's key.
        self.key = key
        #: What comes back.
        self.answer = answer
        #: The query parameter whose presence chooses this entry on a shared route.
        self.selected_by = selected_by
        self.__doc__ = method.__doc__
        signature = inspect.signature(method)
        #: The client method's signature (the provider method's, without ``self``).
        self.signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        self._path_names = [m[1] for m in _PLACEHOLDER.finditer(path)]
        self._check()

    def _check(self) -> None:
        placed = [*self._path_names, *self.body, *self.query, *self.headers]
        params = self.signature.parameters
        where = f"{self.verb} {self.path} ({self.operation})"
        if sorted(placed) != sorted(params):
            raise TypeError(f"{where}: places {sorted(placed)}, the method takes {sorted(params)}")
        if self.verb == "GET" and self.body:
            raise TypeError(f"{where}: a GET has no body")
        for name in self.query:
            if params[name].kind is inspect.Parameter.VAR_KEYWORD and len(self.query) > 1:
                raise TypeError(f"{where}: **{name} takes the whole query string alone")
        if self.key is not None and self.key not in params:
            raise TypeError(f"{where}: key {self.key!r} is not a parameter")
        if self.selected_by is not None and self.selected_by not in self.query:
            raise TypeError(f"{where}: selected_by {self.selected_by!r} is not a query parameter")

    @overload
    def __get__(self, obj: None, owner: type[object] | None = None) -> Endpoint[P, R]: ...

    @overload
    def __get__(self, obj: Caller, owner: type[object] | None = None) -> Callable[P, R]: ...

    def __get__(
        self, obj: Caller | None, owner: type[object] | None = None
    ) -> Endpoint[P, R] | Callable[P, R]:
        if obj is None:
            return self
        caller = obj

        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            result: R = caller.call_endpoint(self, self.request(*args, **kwargs))
            return result

        call.__name__ = call.__qualname__ = self.operation
        call.__doc__ = self.__doc__
        call.__signature__ = self.signature  # type: ignore[attr-defined]
        return call

    # -- the client's side ------------------------------------------------------------------------

    def request(self, *args: P.args, **kwargs: P.kwargs) -> Request:
        """The request a call with these arguments sends.

        Raises:
            TypeError: The arguments do not fit the provider method's signature.
        """
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments

        def in_path(match: re.Match[str]) -> str:
            return quote(str(values[match[1]]), safe="/" if match[2] else "")

        params: dict[str, str] = {}
        for name in self.query:
            if self.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                params.update(values[name])
            elif values[name] is not None:
                params[name] = values[name]
        headers = {h: values[p] for p, h in self.headers.items() if values[p] is not None}
        return Request(
            verb=self.verb,
            path=_PLACEHOLDER.sub(in_path, self.path),
            json={name: values[name] for name in self.body} if self.verb == "POST" else None,
            params=params,
            headers=headers,
            key=None if self.key is None else values[self.key],
        )

    # -- the service's side -----------------------------------------------------------------------

    @property
    def route(self) -> str:
        """The service's path pattern: every path parameter matched as ``:path``."""
        return _PLACEHOLDER.sub(lambda m: f"{{{m[1]}:path}}", self.path)

    def arguments(
        self,
        path: Mapping[str, Any],
        query: Mapping[str, str],
        headers: Mapping[str, str],
        body: Mapping[str, Any],
    ) -> dict[str, Any]:
        """The keyword arguments of the provider's method for one request (see the module
        docstring for what a missing value becomes).

        Raises:
            BadRequest: A body field or a query parameter is missing or of the wrong type.
        """
        arguments: dict[str, Any] = {name: path[name] for name in self._path_names}
        for name, field in self.body.items():
            self._put(arguments, name, field.read(body, name))
        for name in self.query:
            parameter = self.signature.parameters[name]
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(query)
                continue
            value = query.get(name)
            if value is None and parameter.default is inspect.Parameter.empty:
                raise BadRequest(f"{name} is required")
            self._put(arguments, name, value)
        for name, header in self.headers.items():
            value = headers.get(header)
            if value is None and self.signature.parameters[name].default is inspect.Parameter.empty:
                value = ""
            self._put(arguments, name, value)
        return arguments

    def _put(self, arguments: dict[str, Any], name: str, value: Any) -> None:
        if value is None and self.signature.parameters[name].default is not inspect.Parameter.empty:
            return  # the method's default
        arguments[name] = value


def post(
    path: str,
    method: Callable[Concatenate[Any, P], R],
    *,
    body: Mapping[str, Field] | None = None,
    headers: Mapping[str, str] | None = None,
    key: str | None = None,
    answer: Answer = Answer.RESULT,
) -> Endpoint[P, R]:
    """A call that may take effect: ``POST path`` with a JSON body.

    Args:
        path: The route; ``{name}`` places a parameter in it.
        method: The provider's method.
        body: The JSON body's fields, by parameter name.
        headers: Header names, by parameter name (``{"idempotency_key": "Idempotency-Key"}``).
        key: The parameter that is the call's key, named by a lost answer's ``ProviderTimeout``.
        answer: What comes back.
    """
    return Endpoint(
        "POST",
        path,
        method,
        body=body or {},
        query=(),
        headers=headers or {},
        key=key,
        answer=answer,
        selected_by=None,
    )


def get(
    path: str,
    method: Callable[Concatenate[Any, P], R],
    *,
    query: Sequence[str] = (),
    answer: Answer = Answer.RESULT,
    selected_by: str | None = None,
) -> Endpoint[P, R]:
    """A read: ``GET path?query``.

    Args:
        path: The route; ``{name}`` places a parameter in it.
        method: The provider's method.
        query: The query parameters, by parameter name.
        answer: What comes back.
        selected_by: On a route several reads share, the query parameter that chooses this one.
    """
    return Endpoint(
        "GET",
        path,
        method,
        body={},
        query=query,
        headers={},
        key=None,
        answer=answer,
        selected_by=selected_by,
    )


class Table:
    """One provider's HTTP API: a class of :class:`Endpoint` attributes, in route order."""

    #: The provider's name: its paths' first segment and its name in the admin calls.
    KIND: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in vars(cls).items():
            if isinstance(value, Endpoint) and name != value.operation:
                raise TypeError(f"{cls.__name__}.{name} declares {value.operation}: name it so")

    @classmethod
    def endpoints(cls) -> list[Endpoint[..., Any]]:
        """The table's entries, in the order they were declared."""
        return [value for value in vars(cls).values() if isinstance(value, Endpoint)]


def choose(shared: Sequence[Endpoint[..., Any]], query: Mapping[str, str]) -> Endpoint[..., Any]:
    """The entry of a route several share that a request's query string selects.

    Raises:
        BadRequest: The query carries the parameters of two of them.
    """
    for endpoint in shared:
        if endpoint.selected_by is None or endpoint.selected_by in query:
            others = [name for other in shared if other is not endpoint for name in other.query]
            if any(name in query for name in others):
                names = [name for entry in shared for name in entry.query]
                raise BadRequest(f"give at most one of {' and '.join(names)}")
            return endpoint
    raise BadRequest("no operation of this route matches the query")  # pragma: no cover


def check_shared(shared: Sequence[Endpoint[..., Any]]) -> None:
    """Refuse a route shared in a way :func:`choose` cannot tell apart.

    Raises:
        TypeError: Not every entry but the last has a ``selected_by``, or the last has one.
    """
    *first, last = shared
    if any(e.selected_by is None for e in first) or (first and last.selected_by is not None):
        names = ", ".join(e.operation for e in shared)
        raise TypeError(
            f"{last.verb} {last.path} is shared by {names}: each but the last needs a selected_by"
        )
