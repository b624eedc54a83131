"""The operator API (bearer API keys): organisations, workers, assignments, scans and tasks.

Who sees what: an administrator key (no organisation) sees everything; an organisation key sees
its organisation, the workers actively assigned to it, and its scans and tasks. Anything else
answers 404, exactly as an id that does not exist, so a key never learns that another
organisation's resource exists. Administrator-only changes answer 403 to an organisation key,
but only for resources it can already see.

Order of checks in every handler: key (401), path ids and visibility (404), administrator (403),
body (400/422), then one service call per change (each its own transaction).

Revocation (RFC "Cancellation", assignment revocation defaults): new leases stop as soon as the
revocation commits (acquire reads the worker and its assignments in its own transaction). A
security revocation — of the worker, or of an assignment — then cancels the worker's active
tasks (of that organisation), one transaction per task; repeating the request finishes a
revocation that was interrupted midway. A routine removal cancels them too unless
``finish_active=true`` lets them finish. Disabling a worker goes through the same path but ends
its active attempts at once (a disabled worker can neither hear nor acknowledge a cancel): each
task goes back to ``retry_wait``, available to another worker now.

One module per resource; :data:`routes` holds them all, in the order of the OpenAPI document."""

from __future__ import annotations

from leasehold.gateway.api.http import RouteTable
from leasehold.gateway.api.operator.api_keys import (
    KEY_PATH,
    create_api_key,
    get_api_key,
    list_api_keys,
    revoke_api_key,
    rotate_api_key,
)
from leasehold.gateway.api.operator.api_keys import routes as _api_keys
from leasehold.gateway.api.operator.assignments import (
    add_assignment,
    remove_assignment,
    revoke_assignment,
    see_assignment,
    unassign_worker,
)
from leasehold.gateway.api.operator.assignments import routes as _assignments
from leasehold.gateway.api.operator.bulk import routes as _bulk
from leasehold.gateway.api.operator.common import (
    ASSIGNMENT_PATH,
    TAGS,
    TASK_PATH,
    WORKER_PATH,
    read_scan,
    read_task,
    read_worker,
    reads,
    see_task,
)
from leasehold.gateway.api.operator.finding_work import (
    SCAN_STATUSES,
    TASK_STATES,
    counts,
    decode_cursor,
    encode_cursor,
    get_counts,
    get_scan_detail,
    list_scans,
    list_tasks,
    retry,
    retry_task,
    scan_detail,
    scans_page,
    scope,
)
from leasehold.gateway.api.operator.finding_work import routes as _finding_work
from leasehold.gateway.api.operator.organizations import (
    create_organization,
    create_organization_key,
    get_organization,
    list_organizations,
)
from leasehold.gateway.api.operator.organizations import routes as _organizations
from leasehold.gateway.api.operator.profiles import (
    PROFILE_PATH,
    create_profile,
    delete_profile,
    get_admission,
    get_fair_share,
    get_profile,
    get_target_policy,
    list_profiles,
    record_legacy_status,
    replace_profile,
    set_admission,
    set_fair_share,
    set_organization_gateway_execution,
    set_profile_gateway_execution,
    set_target_policy,
)
from leasehold.gateway.api.operator.profiles import routes as _profiles
from leasehold.gateway.api.operator.scans import (
    cancel_scan,
    cancel_task,
    create_scan,
    create_task,
    event_page,
    get_scan,
    get_task,
    organization_assets,
    organization_threats,
    scan_assets,
    task_events,
)
from leasehold.gateway.api.operator.scans import routes as _scans
from leasehold.gateway.api.operator.schedules import (
    SCHEDULE_PATH,
    create_schedule,
    delete_schedule,
    get_schedule,
    list_schedules,
    pause_schedule,
    resume_schedule,
    run_schedule_now,
)
from leasehold.gateway.api.operator.schedules import routes as _schedules
from leasehold.gateway.api.operator.seals import routes as _seals
from leasehold.gateway.api.operator.seals import seal_now
from leasehold.gateway.api.operator.webhooks import routes as _webhooks
from leasehold.gateway.api.operator.workers import (
    disable_worker,
    enable_worker,
    get_worker,
    list_workers,
    register_worker,
    revoke_worker,
    revoke_worker_for_good,
    set_worker_enabled,
    update_worker,
    workers_page,
)
from leasehold.gateway.api.operator.workers import routes as _workers

#: Every operator route, in the order of the OpenAPI document.
routes = RouteTable([
    *_organizations,
    *_api_keys,
    *_workers,
    *_assignments,
    *_scans,
    *_schedules,
    *_profiles,
    *_finding_work,
    *_bulk,
    *_webhooks,
    *_seals,
])

__all__ = [
    'ASSIGNMENT_PATH',
    'KEY_PATH',
    'PROFILE_PATH',
    'SCAN_STATUSES',
    'SCHEDULE_PATH',
    'TAGS',
    'TASK_PATH',
    'TASK_STATES',
    'WORKER_PATH',
    'add_assignment',
    'cancel_scan',
    'cancel_task',
    'counts',
    'create_api_key',
    'create_organization',
    'create_organization_key',
    'create_profile',
    'create_scan',
    'create_schedule',
    'create_task',
    'decode_cursor',
    'delete_profile',
    'delete_schedule',
    'disable_worker',
    'enable_worker',
    'encode_cursor',
    'event_page',
    'get_api_key',
    'get_counts',
    'get_admission',
    'get_fair_share',
    'get_organization',
    'get_profile',
    'get_scan',
    'get_scan_detail',
    'get_schedule',
    'get_target_policy',
    'get_task',
    'get_worker',
    'list_api_keys',
    'list_organizations',
    'list_profiles',
    'list_scans',
    'list_schedules',
    'list_tasks',
    'list_workers',
    'organization_assets',
    'organization_threats',
    'pause_schedule',
    'read_scan',
    'read_task',
    'read_worker',
    'reads',
    'record_legacy_status',
    'register_worker',
    'remove_assignment',
    'replace_profile',
    'resume_schedule',
    'retry',
    'retry_task',
    'revoke_api_key',
    'revoke_assignment',
    'revoke_worker',
    'revoke_worker_for_good',
    'rotate_api_key',
    'routes',
    'run_schedule_now',
    'scan_assets',
    'scan_detail',
    'scans_page',
    'scope',
    'seal_now',
    'see_assignment',
    'see_task',
    'set_admission',
    'set_fair_share',
    'set_organization_gateway_execution',
    'set_profile_gateway_execution',
    'set_target_policy',
    'set_worker_enabled',
    'task_events',
    'unassign_worker',
    'update_worker',
    'workers_page',
]
