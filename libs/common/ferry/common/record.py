"""The base of every record Ferry stores in KV or sends on the bus."""

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    # JSON has no NaN or infinity (pydantic would write them as null, which then does not read back)
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
