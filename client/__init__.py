"""A typed Python client for the leasehold operator API.

    async with OperatorClient("https://gateway:8444", api_key, ca_file="ca.pem") as api:
        page = await api.list_tasks(state="failed_terminal")
        for task in page.items:
            await api.retry_task(task.id)

Every answer is a pydantic model (:mod:`leasehold.client.models`); every problem+json answer is
raised as :class:`ApiError` (``status``, ``title``, ``detail``). Built on aiohttp, and on nothing
of the server: it installs and runs with the base (worker) install.
"""

from leasehold.client.client import ApiError, OperatorClient
from leasehold.client.models import (
    ApiKey,
    ApiKeyCreated,
    ApiKeyPage,
    Asset,
    AssetList,
    Assignment,
    Attempt,
    BulkOperation,
    BulkOperationPage,
    BulkPreview,
    BulkTaskOutcome,
    BulkTaskOutcomePage,
    Counts,
    Event,
    EventPage,
    FairShare,
    Job,
    LiveLease,
    Organization,
    OrganizationCounts,
    OrganizationPage,
    ProfileDeletion,
    QueueCounts,
    Revocation,
    Scan,
    ScanCancellation,
    ScanDetail,
    ScanPage,
    Schedule,
    ScheduleDeletion,
    SchedulePage,
    ScheduleRun,
    StoredProfile,
    StoredProfilePage,
    TargetPolicy,
    Task,
    TaskPage,
    TaskSummary,
    Threat,
    ThreatList,
    Worker,
    WorkerPage,
)

__all__ = [
    "BulkOperation", "BulkOperationPage", "BulkPreview", "BulkTaskOutcome", "BulkTaskOutcomePage",
    "Asset", "AssetList", "Threat", "ThreatList",
    "ApiKey", "ApiKeyPage", "Event", "EventPage", "FairShare", "ProfileDeletion", "Revocation", "Schedule",
    "ScheduleDeletion", "SchedulePage", "ScheduleRun", "StoredProfile", "StoredProfilePage", "TargetPolicy",
    "ApiError", "ApiKeyCreated", "Assignment", "Attempt", "Counts", "Job", "LiveLease", "OperatorClient",
    "Organization", "OrganizationCounts", "OrganizationPage", "QueueCounts", "Scan", "ScanCancellation",
    "ScanDetail", "ScanPage", "Task", "TaskPage", "TaskSummary", "Worker", "WorkerPage",
]
